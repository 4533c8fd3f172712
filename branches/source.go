package branches

import (
	"path/filepath"
	"regexp"
	"strings"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
)

// SourceSyntax is how a source is written (ParseSource).
const SourceSyntax = "[NAME=]cluster:DATADIR, [NAME=]standby:PRIMARY_URL or [NAME=]backup:CHAINDIR[@BACKUP]|FULL+INCR...[,wal=DIR][,target-time=T|,target-lsn=L|,target-name=N]"

// ParseSource reads a source as it is written everywhere (serve's
// declared sources, pgfork branch create without a server):
// [NAME=]KIND:WHERE, KIND one of cluster (a running cluster's data
// directory), standby (a primary's URL) or backup (a chain directory of
// pgfork backup, optionally @BACKUP, or the backups themselves joined by
// '+', full first; then ,wal=DIR and one target for a point in time). Without NAME= the source is named after the last
// element of its path ("standby" for a standby).
func ParseSource(spec string) (Source, error) {
	name, rest, named := strings.Cut(spec, "=")
	if !named || strings.Contains(name, ":") {
		name, rest = "", spec
	}
	kind, where, ok := strings.Cut(rest, ":")
	if !ok || where == "" {
		return Source{}, errs.New(errs.Usage, "bad source %q", spec).WithHint("write it as %s", SourceSyntax)
	}
	src := Source{Name: name, Kind: kind}
	switch kind {
	case SourceCluster:
		src.DataDir = where
	case SourceStandby:
		src.PrimaryURL = where
	case SourceBackup:
		parts := strings.Split(where, ",")
		src.Chain, src.Upto, _ = strings.Cut(parts[0], "@")
		if strings.Contains(src.Chain, "+") {
			if src.Upto != "" {
				return Source{}, errs.New(errs.Usage, "bad source %q: @BACKUP is for a chain directory", spec).
					WithHint("name the backups up to the one you want, full first, or give the chain directory")
			}
			src.Backups, src.Chain = strings.Split(src.Chain, "+"), ""
		}
		for _, kv := range parts[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "wal":
				src.WALDir = v
			case "target-time":
				src.TargetTime = v
			case "target-lsn":
				src.TargetLSN = v
			case "target-name":
				src.TargetName = v
			default:
				return Source{}, errs.New(errs.Usage, "bad source %q: unknown option %q", spec, k).
					WithHint("the options of a backup source are ,wal=DIR and one of ,target-time=T ,target-lsn=L ,target-name=N")
			}
		}
	default:
		return Source{}, errs.New(errs.Usage, "bad source %q: unknown kind %q", spec, kind).WithHint("write it as %s", SourceSyntax)
	}
	if src.Name == "" {
		src.Name = DefaultSourceName(src)
	}
	if err := cluster.ValidateName(src.Name); err != nil {
		return Source{}, errs.New(errs.Usage, "bad source name %q in %q", src.Name, spec).WithHint("name it: NAME=%s", rest)
	}
	return src, nil
}

var notNameChar = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// DefaultSourceName is the name of a source written without one: the
// last element of its path (of its newest backup, for a list of backups;
// a standby: "standby").
func DefaultSourceName(s Source) string {
	p := s.DataDir
	if s.Kind == SourceBackup {
		p = s.Chain
		if len(s.Backups) > 0 {
			p = s.Backups[len(s.Backups)-1]
		}
	}
	if s.Kind == SourceStandby || p == "" {
		return "standby"
	}
	n := strings.Trim(notNameChar.ReplaceAllString(filepath.Base(filepath.Clean(p)), "-"), ".-")
	if len(n) > 40 {
		n = n[:40]
	}
	if n == "" {
		return s.Kind
	}
	return n
}

// String is the source as ParseSource reads it (a standby's URL, which
// holds a password, left out).
func (s Source) String() string {
	var b strings.Builder
	if s.Name != DefaultSourceName(s) {
		b.WriteString(s.Name + "=")
	}
	b.WriteString(s.Kind + ":")
	switch s.Kind {
	case SourceCluster:
		b.WriteString(s.DataDir)
	case SourceStandby:
		b.WriteString("<primary URL>")
	case SourceBackup:
		if len(s.Backups) > 0 {
			b.WriteString(strings.Join(s.Backups, "+"))
		} else {
			b.WriteString(s.Chain)
		}
		if s.Upto != "" {
			b.WriteString("@" + s.Upto)
		}
		for _, kv := range [][2]string{{"wal", s.WALDir}, {"target-time", s.TargetTime}, {"target-lsn", s.TargetLSN}, {"target-name", s.TargetName}} {
			if kv[1] != "" {
				b.WriteString("," + kv[0] + "=" + kv[1])
			}
		}
	}
	return b.String()
}
