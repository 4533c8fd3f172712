package logical

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// persistAfter is how many apply errors of one database, with no progress
// of its slot between them, make them persistent: an apply worker that
// fails restarts by itself (after wal_retrieve_retry_interval, 5 s by
// default), so one error (a lost connection, a timeout under load, no free
// worker slot) is not a failure; the same one again and again while
// nothing is applied is.
const persistAfter = 3

// The new cluster's private server logs with this prefix and in English
// (subscribe sets log_line_prefix and lc_messages), so that its apply
// workers' errors can be read back: pg_stat_subscription_stats counts
// them, and since PostgreSQL 15 nothing but the log says what they were.
const newLogLinePrefix = "%m [%p] "

var (
	// logLine is one line of the log: the pid, the level and the message.
	logLine = regexp.MustCompile(`^[^\[]*\[(\d+)\] ([A-Z]+[0-9]?):  (.*)$`)
	// applyStarted is the line an apply worker of the run logs as it
	// starts (PostgreSQL 15-18; parallel apply workers from 16).
	applyStarted = regexp.MustCompile(`^logical replication (?:parallel )?apply worker for subscription "` + regexp.QuoteMeta(subName) + `" has started`)
	// originContext is the CONTEXT of an error applying a transaction: it
	// names the subscription's replication origin, pg_<subscription oid>.
	originContext = regexp.MustCompile(`replication origin "pg_(\d+)"`)
	// slotContext is the CONTEXT of the old cluster's WAL sender in an
	// error it sent (decoding failed): it names the run's slot.
	slotContext = regexp.MustCompile(`slot "(` + regexp.QuoteMeta(slotPfx) + `\d+)"`)
)

// schemaMismatch are the apply errors a schema change on the publisher
// causes (PostgreSQL 15-18, logical/relation.c and worker.c): the new
// cluster carries no DDL, so they persist until the run rolls back.
var schemaMismatch = []string{
	"logical replication target relation",            // "… is missing replicated column(s): …", "… does not exist", …
	"publisher did not send replica identity column", // a key changed
	"invalid input syntax for type",                  // a column's type changed
}

// logErr is one ERROR an apply worker of the run logged.
type logErr struct {
	pid    int
	text   string
	origin uint32 // the subscription's oid, from the CONTEXT; 0 when none
}

// dbApply is what the run knows of one database's apply errors.
type dbApply struct {
	subid uint32
	slot  string
	count int64      // apply_error_count last read
	base  int64      // the count when its slot was last seen moving
	lsn   pgdata.LSN // its slot's confirmed position then
}

// applyWatch follows the apply workers' errors on the new cluster: the
// counts (one query for all databases) and, only when a count rose, the
// new part of the server log.
type applyWatch struct {
	off     int64
	rest    string
	workers map[int]bool    // pids of the run's apply workers
	open    map[int]*logErr // a pid's last ERROR, for its CONTEXT
	last    *logErr         // the last ERROR, for its continuation lines
	errs    []*logErr
	dbs     map[string]*dbApply
}

// readLog reads what the new cluster's server logged since the last call.
func (w *applyWatch) readLog(path string) {
	if w.workers == nil {
		w.workers, w.open = map[int]bool{}, map[int]*logErr{}
	}
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(w.off, io.SeekStart); err != nil {
		return
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return
	}
	w.off += int64(len(b))
	s := w.rest + string(b)
	end := strings.LastIndexByte(s, '\n')
	w.rest = s[end+1:]
	sc := bufio.NewScanner(strings.NewReader(s[:end+1]))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		w.line(sc.Text())
	}
}

func (w *applyWatch) line(l string) {
	if strings.HasPrefix(l, "\t") {
		if w.last != nil {
			w.last.text += " " + strings.TrimSpace(l)
		}
		return
	}
	m := logLine.FindStringSubmatch(l)
	w.last = nil
	if m == nil {
		return
	}
	pid, _ := strconv.Atoi(m[1])
	switch m[2] {
	case "LOG":
		if applyStarted.MatchString(m[3]) {
			w.workers[pid] = true
			delete(w.open, pid)
		}
	case "ERROR":
		if w.workers[pid] {
			e := &logErr{pid: pid, text: m[3]}
			w.errs = append(w.errs, e)
			w.open[pid], w.last = e, e
		}
	case "CONTEXT":
		if e := w.open[pid]; e != nil && e.origin == 0 {
			if o := originContext.FindStringSubmatch(m[3]); o != nil {
				if n, err := strconv.ParseUint(o[1], 10, 32); err == nil {
					e.origin = uint32(n)
				}
			}
		}
	}
}

// slotOf returns the run's slot an error's text names ("" when none).
func (e *logErr) slotOf() string {
	if m := slotContext.FindStringSubmatch(e.text); m != nil {
		return m[1]
	}
	return ""
}

// texts returns the last few distinct error texts of the subscription
// subid to slot, and whether they are its own: those that name its
// replication origin or its slot, or, where none does (an error outside a
// transaction, as a lost connection, names neither), those of every apply
// worker that name no origin or slot.
func (w *applyWatch) texts(subid uint32, slot string) ([]string, bool) {
	pick := func(own bool) []string {
		var t []string
		for i := len(w.errs) - 1; i >= 0 && len(t) < 2; i-- {
			e := w.errs[i]
			s := e.slotOf()
			match := e.origin == 0 && s == ""
			if own {
				match = e.origin == subid || s == slot
			}
			if match && !slices.Contains(t, e.text) {
				t = append(t, e.text)
			}
		}
		return t
	}
	if t := pick(true); len(t) > 0 {
		return t, true
	}
	return pick(false), false
}

// isSchemaMismatch reports whether an apply error says the publisher's
// schema differs from the new cluster's.
func isSchemaMismatch(text string) bool {
	for _, s := range schemaMismatch {
		if strings.Contains(text, s) {
			return true
		}
	}
	return false
}

// describe says what the log says of database db's apply errors.
func (w *applyWatch) describe(db string) string {
	d := w.dbs[db]
	if d == nil {
		return ""
	}
	t, own := w.texts(d.subid, d.slot)
	switch {
	case len(t) == 0:
		return "the new cluster's log holds no error of its apply worker"
	case own:
		return "its apply worker logged: " + strings.Join(t, "; ")
	default:
		return "apply workers logged (the log names no database for these): " + strings.Join(t, "; ")
	}
}

// summary names the databases with apply errors and what the log says of
// them (for a deadline's message); "" when there were none.
func (w *applyWatch) summary() string {
	var names []string
	for n, d := range w.dbs {
		if d.count > 0 {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names[:min(len(names), 3)] {
		parts = append(parts, fmt.Sprintf("database %q, %d (%s)", n, w.dbs[n].count, w.describe(n)))
	}
	more := ""
	if len(names) > 3 {
		more = fmt.Sprintf(" and %d more databases", len(names)-3)
	}
	return "; apply errors meanwhile: " + strings.Join(parts, ", ") + more
}

// applyErrors judges the apply workers' errors on the new cluster, and
// fails the run only for one that persists: a schema mismatch (DDL on the
// old cluster after the run began: it cannot heal), or persistAfter errors
// of one database while its slot made no progress. Any other error is
// retried by the worker itself; the catch-up's and the window's deadlines
// bound the wait, and their messages name what the log says (summary).
// pg_subscription and its statistics are shared catalogs: one query on any
// database reads every database's count; the log and the slots are read
// only when a count rose.
func (r *run) applyErrors(ctx context.Context) error {
	if len(r.dbs) == 0 || r.dbs[0].new == nil {
		return nil
	}
	w := &r.watch
	if w.dbs == nil {
		w.dbs = map[string]*dbApply{}
	}
	rows, err := r.dbs[0].new.Query(ctx, `SELECT s.oid, d.datname::text, st.apply_error_count FROM pg_subscription s
		JOIN pg_database d ON d.oid = s.subdbid JOIN pg_stat_subscription_stats st ON st.subid = s.oid
		WHERE s.subname = $1 AND st.apply_error_count > 0`, subName)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the subscription statistics of the new cluster")
	}
	var rose []string
	prev := map[string]int64{}
	var subid uint32
	var name string
	var n int64
	for rows.Next() {
		if err := rows.Scan(&subid, &name, &n); err != nil {
			rows.Close()
			return errs.Wrap(errs.Internal, err, "cannot read the subscription statistics of the new cluster")
		}
		d := w.dbs[name]
		if d == nil {
			d = &dbApply{}
			w.dbs[name] = d
		}
		d.subid = subid
		if n > d.count {
			rose = append(rose, name)
			prev[name] = d.count
		}
		d.count = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the subscription statistics of the new cluster")
	}
	if len(rose) == 0 {
		return nil
	}
	slices.Sort(rose)
	w.readLog(r.newInst.LogFile)
	// Where a database's slot moved since its errors were last counted,
	// its worker applied in between: its count starts over from there.
	slots := make([]string, 0, len(rose))
	for _, d := range r.dbs {
		if slices.Contains(rose, d.name) {
			slots = append(slots, d.slot)
		}
	}
	pos := map[string]pgdata.LSN{}
	srows, err := r.control.Query(ctx, `SELECT slot_name::text, coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = ANY($1)`, slots)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the old cluster's slots")
	}
	var slot, lsn string
	for srows.Next() {
		if err := srows.Scan(&slot, &lsn); err != nil {
			srows.Close()
			return errs.Wrap(errs.Internal, err, "cannot read the old cluster's slots")
		}
		if l, err := pgdata.ParseLSN(lsn); err == nil {
			pos[slot] = l
		}
	}
	srows.Close()
	for _, d := range r.dbs {
		a := w.dbs[d.name]
		if a == nil || !slices.Contains(rose, d.name) {
			continue
		}
		if l, ok := pos[d.slot]; ok && l > a.lsn {
			if a.lsn != 0 {
				// Its slot moved since the errors counted before: the
				// worker was retried past them.
				a.base = prev[d.name]
			}
			a.lsn = l
		}
		a.slot = d.slot
		if t, own := w.texts(a.subid, a.slot); own && isSchemaMismatch(t[0]) {
			return errs.New(errs.Unsupported, "replication into database %q of the new cluster stopped: its apply worker failed with: %s. The schema changed on the old cluster after the run began (DDL): logical replication does not carry that", d.name, t[0]).
				WithHint("nothing was changed on the old cluster: run again, with no DDL meanwhile")
		}
		if a.count-a.base >= persistAfter {
			return errs.New(errs.Busy, "replication into database %q of the new cluster keeps failing (%d apply errors while its slot made no progress); %s", d.name, a.count-a.base, w.describe(d.name)).
				WithHint("nothing was changed on the old cluster: run again once the cause is gone")
		}
		phase := PhaseCatchUp
		if r.readOnly {
			phase = PhaseWindow
		}
		r.infof(phase, "the apply worker of database %q failed (apply errors so far: %d; it restarts by itself): %s", d.name, a.count, w.describe(d.name))
	}
	return nil
}
