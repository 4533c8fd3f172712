package clirun

import (
	"strings"
	"testing"
)

// TestRunMasksPassword: a failing tool that prints the database URL (as
// migration tools do in their errors) is reported with its output, but not
// with the password; a missing program names the fix.
func TestRunMasksPassword(t *testing.T) {
	conn := "postgres://u:s3cr%2Fet@127.0.0.1:5432/db?sslmode=disable"
	err := Run(t.Context(), "tool", []string{"sh", "-c", `echo "cannot migrate $0 (pw s3cr/et)"; exit 3`},
		[]string{conn}, nil, conn, "install it")
	if err == nil {
		t.Fatal("no error from a failing command")
	}
	msg := err.Error()
	if !strings.Contains(msg, "cannot migrate") || !strings.Contains(msg, "exit status 3") {
		t.Errorf("error lacks the tool's output or status: %s", msg)
	}
	if strings.Contains(msg, "s3cr") {
		t.Errorf("error shows the password: %s", msg)
	}
	err = Run(t.Context(), "tool", []string{"no-such-tool-pgfork"}, nil, nil, conn, "install it")
	if err == nil || !strings.Contains(err.Error(), "install it") {
		t.Errorf("missing program: err = %v, want the install hint", err)
	}
	if err := Run(t.Context(), "tool", []string{"sh", "-c", "test \"$X\" = y"}, nil, []string{"X=y"}, conn, ""); err != nil {
		t.Errorf("env not passed: %v", err)
	}
}
