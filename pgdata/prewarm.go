package pgdata

import (
	"strconv"
	"strings"
)

// FirstNormalOID is PostgreSQL's FirstNormalObjectId: files of a database
// directory named below it are the system catalogs' (and their indexes').
const FirstNormalOID = 16384

// PrewarmAllMax is the largest database whose files PrewarmDatabase reads
// ahead whole; a bigger one gets its catalogs only. Measured on
// PostgreSQL 18 with file_copy_method = clone on the XFS image (a 15 MB
// template: a 100,000-row table and its index; medians of 20), a test's
// first transaction (create a table, fill it, update 49 rows) took 11.0 ms
// on a fresh clone, 6.1 ms once its files were read (20 ms to read them,
// off the test's path), 3.7 ms on a database used before. At this bound a
// pool of hundreds of ready databases stays within a few GiB of cache.
const PrewarmAllMax = 32 << 20

// CatalogFile says whether name, a file of a database directory, is a
// system catalog's: a relfilenode below FirstNormalOID, with an optional
// fork (_fsm, _vm, _init) and segment (.N).
func CatalogFile(name string) bool {
	base := name
	if i := strings.IndexAny(base, "._"); i >= 0 {
		base = base[:i]
	}
	n, err := strconv.Atoi(base)
	return err == nil && n > 0 && n < FirstNormalOID
}
