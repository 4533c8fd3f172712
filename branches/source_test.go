package branches

import (
	"reflect"
	"testing"
)

// TestParseSource: each way of writing a source reads as meant, and
// String writes it back the same way.
func TestParseSource(t *testing.T) {
	for _, c := range []struct {
		spec string
		want Source
	}{
		{"cluster:/srv/pg/main", Source{Name: "main", Kind: SourceCluster, DataDir: "/srv/pg/main"}},
		{"prod=cluster:/srv/pg/main", Source{Name: "prod", Kind: SourceCluster, DataDir: "/srv/pg/main"}},
		{"backup:/b/chain@20261122T020000Z-incr,wal=/b/wal,target-name=before",
			Source{Name: "chain", Kind: SourceBackup, Chain: "/b/chain", Upto: "20261122T020000Z-incr", WALDir: "/b/wal", TargetName: "before"}},
		{"backup:/b/full+/b/incr1,wal=/b/wal", Source{Name: "incr1", Kind: SourceBackup, Backups: []string{"/b/full", "/b/incr1"}, WALDir: "/b/wal"}},
	} {
		got, err := ParseSource(c.spec)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", c.spec, got, err, c.want)
			continue
		}
		if s := got.String(); s != c.spec {
			t.Errorf("%+v.String() = %q, want %q", got, s, c.spec)
		}
	}
	for _, bad := range []string{"cluster", "disk:/x", "backup:/b/full+/b/incr@x", "backup:/b/c,speed=9", "x/y=cluster:/a"} {
		if _, err := ParseSource(bad); err == nil {
			t.Errorf("ParseSource(%q) took it", bad)
		}
	}
}
