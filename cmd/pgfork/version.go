package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Set at build time by `make build` / `make release`:
//
//	-ldflags "-X main.version=$(git describe) -X main.commit=... -X main.buildDate=..."
//
// A plain `go build` or `go install` leaves them empty and buildInfo falls
// back to what the Go toolchain records (module version, VCS revision/time).
var version, commit, buildDate string

// versionInfo is what `pgfork version` prints.
type versionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	BuildDate string `json:"build_date"`
	Modified  bool   `json:"modified,omitempty"`
	Go        string `json:"go"`
	Platform  string `json:"platform"`
}

// buildInfo returns the version, commit and build date of this binary.
func buildInfo() versionInfo {
	v := versionInfo{Version: version, Commit: commit, BuildDate: buildDate,
		Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if v.Commit == "" {
					v.Commit = s.Value
				}
			case "vcs.time":
				if v.BuildDate == "" {
					v.BuildDate = s.Value
				}
			case "vcs.modified":
				v.Modified = s.Value == "true" && version == ""
			}
		}
	}
	if v.Version == "" {
		v.Version = "devel"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	if v.BuildDate == "" {
		v.BuildDate = "unknown"
	}
	return v
}

// String is the one-line form, as `pgfork --version` prints it.
func (v versionInfo) String() string {
	c := v.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if v.Modified {
		c += "-dirty"
	}
	return fmt.Sprintf("pgfork %s (commit %s, built %s, %s, %s)", v.Version, c, v.BuildDate, v.Go, v.Platform)
}

// addVersion gives root its --version flag and version command.
func (cl *cli) addVersion(root *cobra.Command) {
	root.Version = buildInfo().Version
	root.SetVersionTemplate("{{printf \"%s\" .Annotations.version}}\n")
	root.Annotations = map[string]string{"version": buildInfo().String()}
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print pgfork's version, commit and build date",
		Example: `  pgfork version
  pgfork --version
  pgfork version --json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildInfo()
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.String())
			return nil
		},
	})
}
