package pgdata

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgversion"
)

// Cluster states as pg_controldata prints them (LC_ALL=C).
const (
	StateStartingUp          = "starting up"
	StateShutDown            = "shut down"
	StateShutDownInRecovery  = "shut down in recovery"
	StateShuttingDown        = "shutting down"
	StateInCrashRecovery     = "in crash recovery"
	StateInArchiveRecovery   = "in archive recovery"
	StateInProduction        = "in production"
	stateUnrecognizedPattern = "unrecognized status code"
)

// ControlData is what pg_controldata reports about a data directory.
type ControlData struct {
	// State is the cluster state, e.g. "shut down" or "in production".
	State string `json:"state"`
	// SystemIdentifier is the unique id initdb gave the cluster (a clone
	// shares it with its source).
	SystemIdentifier uint64 `json:"system_identifier"`
	// CatalogVersion is the catalog version number (e.g. 202209061).
	CatalogVersion uint32 `json:"catalog_version"`
	// ControlVersion is the pg_control version number (e.g. 1300).
	ControlVersion uint32 `json:"pg_control_version"`
	// DataChecksumVersion is 0 when data checksums are off.
	DataChecksumVersion uint32 `json:"data_checksum_version"`
	// BlockSize is the database block size in bytes.
	BlockSize int `json:"block_size"`
	// WALSegmentSize is the size of a WAL segment file in bytes.
	WALSegmentSize int64 `json:"wal_segment_size"`
	// CheckpointLocation is the latest checkpoint's location, e.g. "0/1500718".
	CheckpointLocation string `json:"checkpoint_location"`
	// RedoLocation is the latest checkpoint's REDO location.
	RedoLocation string `json:"redo_location"`
	// RedoWALFile is the WAL file holding the REDO location.
	RedoWALFile string `json:"redo_wal_file,omitempty"`
	// TimeLineID is the latest checkpoint's timeline.
	TimeLineID uint32 `json:"timeline"`
	// Fields holds every "name: value" line as printed.
	Fields map[string]string `json:"-"`
	// Warnings are WARNING lines pg_controldata printed (e.g. a CRC
	// mismatch when the binaries are of another major than the data).
	Warnings []string `json:"warnings,omitempty"`
}

// CleanShutdown reports whether the cluster was shut down cleanly, so its
// files are consistent without WAL replay: "shut down" (a primary) or
// "shut down in recovery" (a standby that was stopped).
func (c *ControlData) CleanShutdown() bool {
	return c != nil && (c.State == StateShutDown || c.State == StateShutDownInRecovery)
}

// ChecksumsEnabled reports whether data page checksums are on.
func (c *ControlData) ChecksumsEnabled() bool { return c != nil && c.DataChecksumVersion != 0 }

// ReadControlData runs binDir/pg_controldata on dataDir (with LC_ALL=C and
// env added) and parses its output. The binaries must be of the data
// directory's major version: others cannot read its pg_control reliably, so
// a mismatch is errs.Unsupported.
func ReadControlData(ctx context.Context, binDir, dataDir string, env []string) (*ControlData, error) {
	if err := Check(dataDir); err != nil {
		return nil, err
	}
	dataMajor, err := Version(dataDir)
	if err != nil {
		return nil, err
	}
	prog := filepath.Join(binDir, "pg_controldata")
	if binMajor, err := toolMajor(ctx, prog, env); err != nil {
		return nil, err
	} else if binMajor != dataMajor {
		return nil, errs.New(errs.Unsupported, "the data directory is PostgreSQL %d but %s is PostgreSQL %d", dataMajor, prog, binMajor).
			WithPath(dataDir).WithHint("use the PostgreSQL %d binaries", dataMajor).WithCLI("--pg %d; `pgfork pg install %d` if missing", dataMajor, dataMajor)
	}
	cmd := exec.CommandContext(ctx, prog, "-D", dataDir)
	cmd.Env = append(append(os.Environ(), "LC_ALL=C", "LANG=C"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return nil, errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted while reading pg_control")
		}
		msg := strings.TrimSpace(stderr.String())
		kind := errs.Internal
		if strings.Contains(msg, "Permission denied") {
			kind = errs.Permission
		}
		return nil, errs.Wrap(kind, err, "pg_controldata failed: %s", msg).WithPath(dataDir).
			WithHint("check that global/pg_control is readable and not damaged")
	}
	cd, err := ParseControlData(string(out))
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot parse the output of pg_controldata").WithPath(dataDir)
	}
	for _, l := range strings.Split(stderr.String(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			cd.Warnings = append(cd.Warnings, l)
		}
	}
	return cd, nil
}

// ParseControlData parses pg_controldata's output (as printed with LC_ALL=C).
func ParseControlData(out string) (*ControlData, error) {
	cd := &ControlData{Fields: map[string]string{}}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "WARNING") {
			cd.Warnings = append(cd.Warnings, strings.TrimSpace(line))
			continue
		}
		// Names contain ':' only before the value ("...'s oldestXID's DB:").
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		cd.Fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	var errList []error
	str := func(name string) string {
		v, ok := cd.Fields[name]
		if !ok {
			errList = append(errList, fmt.Errorf("no %q line", name))
		}
		return v
	}
	num := func(name string, bits int) uint64 {
		v := str(name)
		if v == "" {
			return 0
		}
		n, err := strconv.ParseUint(v, 10, bits)
		if err != nil {
			errList = append(errList, fmt.Errorf("%s: %q is not a number", name, v))
		}
		return n
	}
	lsn := func(name string) string {
		v := str(name)
		if _, err := ParseLSN(v); v != "" && err != nil {
			errList = append(errList, fmt.Errorf("%s: %q is not a WAL location", name, v))
		}
		return v
	}
	cd.State = str("Database cluster state")
	cd.SystemIdentifier = num("Database system identifier", 64)
	cd.CatalogVersion = uint32(num("Catalog version number", 32))
	cd.ControlVersion = uint32(num("pg_control version number", 32))
	cd.DataChecksumVersion = uint32(num("Data page checksum version", 32))
	cd.BlockSize = int(num("Database block size", 32))
	cd.WALSegmentSize = int64(num("Bytes per WAL segment", 63))
	cd.CheckpointLocation = lsn("Latest checkpoint location")
	cd.RedoLocation = lsn("Latest checkpoint's REDO location")
	cd.RedoWALFile = cd.Fields["Latest checkpoint's REDO WAL file"]
	cd.TimeLineID = uint32(num("Latest checkpoint's TimeLineID", 32))
	if strings.HasPrefix(cd.State, stateUnrecognizedPattern) {
		errList = append(errList, fmt.Errorf("unknown cluster state %q", cd.State))
	}
	if err := errors.Join(errList...); err != nil {
		return nil, err
	}
	return cd, nil
}

func toolMajor(ctx context.Context, prog string, env []string) (int, error) {
	cmd := exec.CommandContext(ctx, prog, "--version")
	cmd.Env = append(append(os.Environ(), "LC_ALL=C"), env...)
	out, err := cmd.Output()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
			return 0, errs.Wrap(errs.NotFound, err, "pg_controldata not found").WithPath(prog).
				WithHint("use a complete PostgreSQL bin directory").WithCLI("point --pg-bin at one")
		}
		return 0, errs.Wrap(errs.Internal, err, "`pg_controldata --version` failed").WithPath(prog)
	}
	major, err := pgversion.MajorFromToolOutput(out)
	if err != nil {
		return 0, errs.Wrap(errs.Internal, err, "unexpected output of pg_controldata").WithPath(prog)
	}
	return major, nil
}
