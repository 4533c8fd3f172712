package upgrade

import (
	"fmt"
	"strings"
)

// Finding is a problem pg_upgrade reported, in its words and in plain ones.
type Finding struct {
	// Check is the pg_upgrade step that found it ("" when pg_upgrade
	// failed outside a named check).
	Check string `json:"check,omitempty"`
	// Severity is "fatal" (the upgrade cannot go on) or "warning".
	Severity string `json:"severity"`
	// Detail is pg_upgrade's own explanation.
	Detail string `json:"detail"`
	// Plain says what it means, and Hint what to do about it.
	Plain string `json:"plain"`
	Hint  string `json:"hint,omitempty"`
	// Files are the lists of affected objects pg_upgrade wrote.
	Files []string `json:"files,omitempty"`
}

func (f Finding) String() string {
	s := f.Plain
	if f.Check != "" {
		s = f.Check + ": " + s
	}
	if f.Hint != "" {
		s += "\n      what to do: " + f.Hint
	}
	for _, p := range f.Files {
		s += "\n      list: " + p
	}
	return s
}

// parseFindings extracts the problems from pg_upgrade's output: steps that
// ended "fatal" or "warning" with the explanation that follows them, and a
// failure reported outside any step ("...\nFailure, exiting").
func parseFindings(out string) []Finding {
	lines := strings.Split(strings.ReplaceAll(out, "\r", ""), "\n")
	var fs []Finding
	var cur *Finding
	var loose []string // lines since the last step, for failures outside a step
	flush := func() {
		if cur != nil {
			cur.Detail = strings.TrimSpace(cur.Detail)
			explain(cur)
			fs = append(fs, *cur)
			cur = nil
		}
	}
	for _, l := range lines {
		if name, status, ok := stepLine(l); ok {
			flush()
			loose = nil
			if status == "fatal" || status == "warning" || status == "failed" {
				sev := "fatal"
				if status == "warning" {
					sev = "warning"
				}
				cur = &Finding{Check: name, Severity: sev}
			}
			continue
		}
		t := strings.TrimSpace(l)
		if t == "Failure, exiting" {
			if cur == nil && len(fs) == 0 {
				detail := strings.TrimSpace(strings.Join(loose, "\n"))
				if detail != "" {
					cur = &Finding{Severity: "fatal", Detail: detail}
				}
			}
			flush()
			loose = nil
			continue
		}
		if cur != nil {
			if strings.HasPrefix(l, "    ") && strings.Contains(t, "/") {
				cur.Files = append(cur.Files, t)
			}
			cur.Detail += l + "\n"
			continue
		}
		if t == "" || strings.HasPrefix(t, "---") || t == "Performing Consistency Checks" || t == "Performing Upgrade" {
			continue
		}
		loose = append(loose, l)
	}
	flush()
	return fs
}

// knownProblems maps words in pg_upgrade's explanations to plain words and
// what to do. The first match wins.
var knownProblems = []struct {
	match       []string // any of these, lower case
	plain, hint string
}{
	{[]string{"data checksums"},
		"the old and new clusters differ in data checksums (pg_upgrade cannot turn them on or off)",
		"let pgfork create NEW_DATADIR: it matches the old cluster's setting; or re-create it with initdb --data-checksums / --no-data-checksums"},
	{[]string{"install user", "only the install user"},
		"pg_upgrade must connect as the bootstrap superuser, and the new cluster may have no other roles",
		"let pgfork create NEW_DATADIR, or pass --superuser with the old cluster's bootstrap superuser"},
	{[]string{"prepared transaction"},
		"the old cluster has prepared transactions that were never committed or rolled back",
		"start it, look at pg_prepared_xacts and finish each with COMMIT PREPARED or ROLLBACK PREPARED, stop it, run again"},
	{[]string{"loadable_libraries", "required libraries", "could not load library"},
		"databases use extensions whose libraries the new PostgreSQL installation does not have",
		"install those extensions for the new major (the list names the libraries), or drop them from the old cluster"},
	{[]string{"reg* data types", "reg*"},
		"tables store reg* types (regclass, regproc...) whose values are OIDs that pg_upgrade cannot keep",
		"change those columns to text or drop them (the list names them), then run again"},
	{[]string{"contrib/isn"},
		"the isn extension is used with a bigint passing convention that differs between the builds",
		"drop the isn columns/extension or dump and restore those databases"},
	{[]string{"aclitem", "sql_identifier", "abstime", "reltime", "tinterval", "\"unknown\"", "line\" data type", "jsonb", "data type in user tables", "tables_using_"},
		"tables use a data type whose on-disk format changed, so their files cannot be reused",
		"alter or drop the columns in the list, then run again"},
	{[]string{"not shut down cleanly", "shut down cleanly"},
		"the old cluster was not shut down cleanly",
		"start it and stop it with a clean (fast or smart) shutdown, then run again"},
	{[]string{"postmaster servicing", "postmaster.pid"},
		"a server is running on the old cluster",
		"stop it (pgfork upgrade --stop-old does a clean fast shutdown)"},
	{[]string{"tablespace director"},
		"the tablespace locations already hold a directory for the new major (left by an earlier upgrade)",
		"if no cluster uses it, remove the PG_<major>_* directory named above from each tablespace location"},
	{[]string{"replication slot"},
		"the old cluster has replication slots that cannot be carried over as they are",
		"make sure subscribers consumed all WAL and drop or advance the slots (the list names them), then run again"},
	{[]string{"clone file", "reflink", "ficlone"},
		"the filesystem cannot clone files between the old and new data directories",
		"use --mode auto (pgfork picks what the filesystem can do) or --mode copy"},
	{[]string{"copy_file_range"},
		"the kernel or filesystem cannot copy_file_range between the data directories",
		"use --mode auto or --mode copy"},
	{[]string{"hard link", "link file"},
		"files cannot be hard-linked between the old and new data directories (they must be on one filesystem)",
		"use --mode auto or --mode copy, or put NEW_DATADIR on the old cluster's filesystem"},
	{[]string{"block size", "blocksz"},
		"the two PostgreSQL builds use different block sizes",
		"use a build of the new major compiled with the old cluster's block size"},
	{[]string{"encoding", "lc_collate", "lc_ctype", "locale"},
		"the old and new clusters differ in encoding or locale",
		"let pgfork create NEW_DATADIR: it matches the old cluster's encoding and locale"},
	{[]string{"connection to server", "could not connect", "connection to database failed"},
		"pg_upgrade could not connect to one of the servers it started",
		"read the server logs named in pg_upgrade's output"},
	{[]string{"no space left", "could not write"},
		"the disk filled up",
		"free space on the target filesystem or use --mode clone/link"},
	{[]string{"cannot be upgraded", "only upgrade from", "upgrade from postgresql", "new cluster version", "old cluster version", "major version"},
		"pg_upgrade cannot upgrade between these versions",
		"see pg_upgrade's supported versions; upgrade in two steps through an intermediate major if needed"},
}

// explain fills f.Plain and f.Hint from the known problems.
func explain(f *Finding) {
	text := strings.ToLower(f.Check + "\n" + f.Detail)
	for _, k := range knownProblems {
		for _, m := range k.match {
			if strings.Contains(text, m) {
				f.Plain, f.Hint = k.plain, k.hint
				return
			}
		}
	}
	first := strings.TrimSpace(strings.SplitN(f.Detail, "\n\n", 2)[0])
	first = strings.Join(strings.Fields(first), " ")
	if first == "" {
		first = "pg_upgrade reported a problem"
	}
	f.Plain = first
	f.Hint = "read pg_upgrade's explanation below and its logs"
}

// findingsText formats findings for an error message.
func findingsText(fs []Finding) string {
	var b strings.Builder
	for i, f := range fs {
		fmt.Fprintf(&b, "\n  %d. %s", i+1, f)
		if f.Detail != "" {
			b.WriteString("\n      pg_upgrade said: " + strings.ReplaceAll(strings.Join(strings.Fields(f.Detail), " "), "\n", " "))
		}
	}
	return b.String()
}
