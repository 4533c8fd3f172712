// Package pgversion holds the small facts of PostgreSQL version strings that
// several packages need: what a program's `--version` output says, and the
// major of a version. One parser for every caller (pgbin, pgdata, instance),
// so that "18beta1", "15.18 (Debian 15.18-0+deb12u1)" and "17devel" read the
// same everywhere. It imports nothing of pgfork's.
package pgversion

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var (
	toolRe  = regexp.MustCompile(`\(PostgreSQL\)\s+(\d+(?:\.\d+)*(?:(?:alpha|beta|rc|devel)\d*)?)`)
	majorRe = regexp.MustCompile(`^(\d+)(?:\.(\d+))?`)
)

// FromToolOutput returns the version a PostgreSQL program's `--version`
// output reports ("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" →
// "15.18"), or an error quoting the output.
func FromToolOutput(out []byte) (string, error) {
	m := toolRe.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("not the output of a PostgreSQL program's --version: %q", strings.TrimSpace(string(out)))
	}
	return string(m[1]), nil
}

// Major returns the major version of a PostgreSQL version string: 15 for
// "15.18", 18 for "18beta1". Versions before 10 ("9.6.24") have two-part
// majors and are not supported by pgfork; Major returns their first part.
func Major(version string) (int, error) {
	m := majorRe.FindStringSubmatch(version)
	if m == nil {
		return 0, fmt.Errorf("not a PostgreSQL version: %q", version)
	}
	return strconv.Atoi(m[1])
}

// MajorFromToolOutput is Major(FromToolOutput(out)).
func MajorFromToolOutput(out []byte) (int, error) {
	v, err := FromToolOutput(out)
	if err != nil {
		return 0, err
	}
	return Major(v)
}
