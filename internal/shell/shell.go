// Package shell builds the command lines pgfork prints for a person to paste
// into a POSIX shell (how to start a clone, connect to a branch, remove a
// snapshot). It runs nothing.
package shell

import "strings"

// Quote returns s as one word of a POSIX shell: bare when it is made only of
// characters no shell treats specially (letters, digits and / . - _ = : , +),
// else in single quotes (a single quote inside is closed, escaped and reopened).
func Quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == '=' || r == ':' || r == ',' || r == '+' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// AsUser prefixes the command line c with env (NAME=value entries, run
// through env(1)) and, when user is not "", with runuser to that OS user, as
// root must run a PostgreSQL tool for a cluster owned by another user.
func AsUser(user string, env []string, c string) string {
	if len(env) > 0 {
		q := make([]string, len(env))
		for i, e := range env {
			q[i] = Quote(e)
		}
		c = "env " + strings.Join(q, " ") + " " + c
	}
	if user != "" {
		c = "runuser -u " + Quote(user) + " -- " + c
	}
	return c
}
