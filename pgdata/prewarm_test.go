package pgdata

import "testing"

func TestCatalogFile(t *testing.T) {
	for name, want := range map[string]bool{"1259": true, "1259_fsm": true, "2619_vm": true, "2608.1": true,
		"16384": false, "24576_fsm": false, "PG_VERSION": false, "pg_filenode.map": false, "pg_internal.init": false, "0": false} {
		if got := CatalogFile(name); got != want {
			t.Errorf("CatalogFile(%q) = %v, want %v", name, got, want)
		}
	}
}
