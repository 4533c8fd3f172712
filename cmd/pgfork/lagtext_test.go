package main

import (
	"encoding/json"
	"testing"

	"github.com/pgfork/pgfork/branches"
)

// TestLagTextNotStreaming (issue 32, F7): `pgfork branch ls` shows a
// standby that does not stream as an error, with its lag; an unknown lag
// and a streaming standby's lag as before.
func TestLagTextNotStreaming(t *testing.T) {
	for _, c := range []struct{ api, want string }{
		{`{"bytes": 2048, "seconds": 3.5, "streaming": false, "error": "not streaming from its primary for 20s: …"}`,
			"ERROR: not streaming from its primary for 20s: … (lag 2.0 KiB, 3.5 s)"},
		{`{"bytes": 0, "seconds": null, "streaming": false, "error": "cannot reach the standby"}`, "lag unknown: cannot reach the standby"},
		{`{"bytes": 0, "seconds": 0, "streaming": true}`, "lag 0 B, 0.0 s"},
	} {
		var v branches.Lag
		if err := json.Unmarshal([]byte(c.api), &v); err != nil {
			t.Fatal(err)
		}
		if got := lagText(&v); got != c.want {
			t.Errorf("lagText(%s) = %q, want %q", c.api, got, c.want)
		}
	}
}
