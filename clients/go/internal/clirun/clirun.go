// Package clirun runs a migration tool's command line for the CLI-based
// migrator adapters (atlas, dbmate) and turns a failure into an error that
// carries the tool's output, without the database password.
package clirun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Run runs command (program and leading arguments) with args appended and
// env added to the environment, and returns an error naming tool, with its
// output, if it fails; connString's password is masked in the message. A
// missing program is reported with installHint.
func Run(ctx context.Context, tool string, command, args, env []string, connString, installHint string) error {
	if len(command) == 0 {
		return fmt.Errorf("%s: no command to run", tool)
	}
	if _, err := exec.LookPath(command[0]); err != nil {
		return fmt.Errorf("%s: %q not found on PATH: %s", tool, command[0], installHint)
	}
	cmd := exec.CommandContext(ctx, command[0], append(append([]string{}, command[1:]...), args...)...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		err = errors.Join(ctxErr, err)
	}
	msg := strings.TrimSpace(out.String())
	if pw := password(connString); pw != "" {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
		msg = strings.ReplaceAll(msg, url.QueryEscape(pw), "xxxxx")
	}
	return fmt.Errorf("%s: %w\n%s", tool, err, msg)
}

func password(connString string) string {
	u, err := url.Parse(connString)
	if err != nil || u.User == nil {
		return ""
	}
	pw, _ := u.User.Password()
	return pw
}

// DirFS returns the migration directory dir, its symbolic links resolved, for
// the template hash; tool names the migrator in the error.
func DirFS(tool, dir string) (fs.FS, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("%s migrations: %w", tool, err)
	}
	return os.DirFS(root), nil
}

// Command returns command, or the program def alone when command is empty.
func Command(command []string, def string) []string {
	if len(command) == 0 {
		return []string{def}
	}
	return command
}
