package pgversion

import "testing"

func TestFromToolOutput(t *testing.T) {
	for out, want := range map[string]string{
		"postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n": "15.18",
		"initdb (PostgreSQL) 18.6\n":                             "18.6",
		"pg_controldata (PostgreSQL) 18beta1\n":                  "18beta1",
		"postgres (PostgreSQL) 17devel":                          "17devel",
		"pg_ctl (PostgreSQL) 9.6.24":                             "9.6.24",
	} {
		got, err := FromToolOutput([]byte(out))
		if err != nil || got != want {
			t.Errorf("FromToolOutput(%q) = %q, %v; want %q", out, got, err, want)
		}
	}
	for _, bad := range []string{"", "postgres 15.18", "(PostgreSQL)", "bash: postgres: command not found"} {
		if v, err := FromToolOutput([]byte(bad)); err == nil {
			t.Errorf("FromToolOutput(%q) = %q, want an error", bad, v)
		}
	}
}

func TestMajor(t *testing.T) {
	for v, want := range map[string]int{"15.18": 15, "18beta1": 18, "18.6.0": 18, "17devel": 17, "10.0": 10, "9.6.24": 9, "18": 18} {
		if got, err := Major(v); err != nil || got != want {
			t.Errorf("Major(%q) = %d, %v; want %d", v, got, err, want)
		}
	}
	if _, err := Major("abc"); err == nil {
		t.Error("Major(abc) succeeded")
	}
	if m, err := MajorFromToolOutput([]byte("initdb (PostgreSQL) 18.6\n")); err != nil || m != 18 {
		t.Errorf("MajorFromToolOutput = %d, %v", m, err)
	}
}
