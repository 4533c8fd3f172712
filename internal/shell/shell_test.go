package shell

import (
	"os/exec"
	"testing"
)

// TestQuoteRoundTrip: what Quote makes, sh reads back as the same single
// word, for plain words and for every character a shell treats specially.
func TestQuoteRoundTrip(t *testing.T) {
	for _, s := range []string{"", "plain", "/srv/pg/branch-1", "a b", "it's", `$HOME`, "`x`", "a;b", "*", "a\nb", `\`, "--db=x,y:z+1", "é"} {
		out, err := exec.Command("sh", "-c", "printf %s "+Quote(s)).Output()
		if err != nil {
			t.Fatalf("sh with %q: %v", Quote(s), err)
		}
		if string(out) != s {
			t.Errorf("Quote(%q) = %s reads back as %q", s, Quote(s), out)
		}
	}
	if got := Quote("/srv/pg/main"); got != "/srv/pg/main" {
		t.Errorf("a safe path is quoted: %s", got)
	}
}

func TestAsUser(t *testing.T) {
	got := AsUser("postgres", []string{"LD_LIBRARY_PATH=/opt/pg lib"}, "pg_ctl start")
	want := "runuser -u postgres -- env 'LD_LIBRARY_PATH=/opt/pg lib' pg_ctl start"
	if got != want {
		t.Errorf("AsUser = %q, want %q", got, want)
	}
	if got := AsUser("", nil, "pg_ctl start"); got != "pg_ctl start" {
		t.Errorf("AsUser without user or env = %q", got)
	}
}
