package pgclone

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbin"
)

// session is one connection to the source. The backup must start and stop
// on the same session, so everything runs on one.
type session interface {
	// queryRow runs sql with $1, $2... bound to args and returns the
	// first row's columns as text (NULL as ""); pgx.ErrNoRows if none.
	// Server errors are *pgconn.PgError.
	queryRow(ctx context.Context, sql string, args []string) ([]string, error)
	// closed reports whether the connection is gone.
	closed() bool
	close()
}

// pgxSession is a session over a pgx connection: the usual way.
type pgxSession struct{ conn *pgx.Conn }

func connectPgx(ctx context.Context, connString, srcDir string) (session, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad connection string for the source").WithHint("give a libpq URL such as postgresql://postgres@/postgres?host=/run/postgresql&port=5432")
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "pgfork clone"
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		e := errs.Wrap(errs.NotFound, err, "cannot connect to the running source").WithPath(srcDir).
			WithHint("check that the source is running and that the connection URL (user, socket directory or host, port) reaches it").WithCLI("check --url")
		if os.Geteuid() == 0 && strings.Contains(err.Error(), "authentication failed") {
			e = e.WithHint("pgfork runs as root, so peer authentication refuses it: give a connection URL with a user (its password in PGPASSFILE, ~/.pgpass or PGPASSWORD, never in the URL), or allow the connection in pg_hba.conf").WithCLI("--url")
		}
		return nil, e
	}
	return &pgxSession{conn: conn}, nil
}

func (p *pgxSession) queryRow(ctx context.Context, sql string, args []string) ([]string, error) {
	a := make([]any, len(args))
	for i, v := range args {
		a[i] = v
	}
	rows, err := p.conn.Query(ctx, sql, a...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, err
		}
		return nil, pgx.ErrNoRows
	}
	vals := make([]*string, len(rows.FieldDescriptions()))
	dest := make([]any, len(vals))
	for i := range vals {
		dest[i] = &vals[i]
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]string, len(vals))
	for i, v := range vals {
		if v != nil {
			out[i] = *v
		}
	}
	return out, nil
}

func (p *pgxSession) closed() bool { return p.conn.IsClosed() }

func (p *pgxSession) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.conn.Close(ctx)
}

// DataDirOwner returns the OS user that owns dataDir: the user the cluster
// runs as, whom peer authentication lets in as the same-named role.
func DataDirOwner(dataDir string) (*instance.OSUser, error) {
	u, err := instance.OwnerOf(dataDir)
	if err != nil && errs.KindOf(err) == errs.NotFound && !errors.Is(err, fs.ErrNotExist) {
		return nil, errs.Wrap(errs.NotFound, err, "the source data directory's owner has no user name").
			WithHint("give a connection URL to say how to connect to the source").WithCLI("--url")
	}
	return u, err
}

// psqlSession is a session held by one psql process run as the cluster's
// OS user: as root, peer authentication (Debian's default for local
// connections) refuses a connection from pgfork itself, but lets the
// cluster's owner in. psql reads SQL on its stdin and answers in CSV on its
// stdout; after each query it echoes a marker on stdout and on stderr, so
// the answer and any error are read up to the marker. psql runs with
// ON_ERROR_STOP off, so an error (a missing replication slot, say) does not
// end the session; the session ends when psql does, and with it the backup.
type psqlSession struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // stdout, line by line; closed at EOF
	errMu  sync.Mutex
	errBuf bytes.Buffer // stderr
	errCh  chan struct{}
	done   chan struct{} // closed when psql has exited
	token  string
	n      int
}

// connectPsql starts psql as u on the server running on srcDir (from its
// postmaster.pid, role u.Name, database postgres) and checks it connected.
func connectPsql(ctx context.Context, inst pgbin.Installation, u *instance.OSUser, srcDir string) (session, error) {
	if inst.Major != 0 && inst.Major < 13 {
		return nil, errs.New(errs.Unsupported, "as root, pgfork connects to the source through psql as its owner, which needs psql 13 or later (this is %s)", inst.Version).
			WithPath(srcDir).WithHint("give a connection URL with a user the source accepts (its password in PGPASSFILE, ~/.pgpass or PGPASSWORD, never in the URL)").WithCLI("--url")
	}
	conn, err := connStringAs(srcDir, u.Name)
	if err != nil {
		return nil, err
	}
	tok := make([]byte, 12)
	_, _ = rand.Read(tok)
	// Not CommandContext: a cancelled ctx ends psql through close, so its
	// exit is always observed.
	cmd := u.Command(context.Background(), append(inst.Env(), "PGAPPNAME=pgfork clone", "PGCONNECT_TIMEOUT=30"), inst.Tool("psql"),
		"-X", "-q", "--csv", "-t", "-v", "ON_ERROR_STOP=0", "-v", "VERBOSITY=verbose", "-v", "SHOW_CONTEXT=never", "-d", conn)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot run psql")
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot run psql")
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot run psql")
	}
	if err := cmd.Start(); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot run psql as %s", u.Name).WithPath(cmd.Path)
	}
	p := &psqlSession{cmd: cmd, stdin: stdin, lines: make(chan string, 64), errCh: make(chan struct{}, 1),
		done: make(chan struct{}), token: "pgfork-" + hex.EncodeToString(tok)}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(p.lines)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				p.lines <- line
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			n, err := stderr.Read(buf)
			if n > 0 {
				p.errMu.Lock()
				p.errBuf.Write(buf[:n])
				p.errMu.Unlock()
				select {
				case p.errCh <- struct{}{}:
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		close(p.done)
	}()
	if _, err := p.queryRow(ctx, "SELECT 1", nil); err != nil {
		p.close()
		if ctx.Err() != nil {
			return nil, errs.Wrap(errs.Interrupted, ctx.Err(), "clone interrupted")
		}
		return nil, errs.Wrap(errs.NotFound, err, "cannot connect to the running source as %s (through psql)", u.Name).WithPath(srcDir).
			WithHint("check that the source accepts local connections of its owner %s (pg_hba.conf), or give a connection URL", u.Name).WithCLI("--url")
	}
	return p, nil
}

// psqlErrLine is an error as psql prints it with VERBOSITY verbose, after
// the "psql:<stdin>:N: " it puts before errors of a script.
var psqlErrLine = regexp.MustCompile(`(?m)^(?:psql:.*?: )?(ERROR|FATAL|PANIC):  (?:([0-9A-Z]{5}): )?(.*)$`)

func (p *psqlSession) queryRow(ctx context.Context, sql string, args []string) ([]string, error) {
	if p.closed() {
		return nil, p.lostErr()
	}
	p.n++
	marker := fmt.Sprintf("%s-%d", p.token, p.n)
	p.errMu.Lock()
	errStart := p.errBuf.Len()
	p.errMu.Unlock()
	script := inlineArgs(sql, args) + ";\n\\echo " + marker + "\n\\warn " + marker + "\n"
	if _, err := io.WriteString(p.stdin, script); err != nil {
		return nil, p.lostErr()
	}
	// The answer, up to the marker on stdout.
	var out strings.Builder
	for {
		select {
		case <-ctx.Done():
			p.close()
			return nil, ctx.Err()
		case line, ok := <-p.lines:
			if !ok {
				<-p.done
				return nil, p.lostErr()
			}
			if strings.TrimRight(line, "\r\n") == marker {
				goto stdoutDone
			}
			out.WriteString(line)
		}
	}
stdoutDone:
	// Then the errors, up to the marker on stderr.
	var errText string
	for {
		p.errMu.Lock()
		all := p.errBuf.String()
		p.errMu.Unlock()
		if i := strings.Index(all[errStart:], marker+"\n"); i >= 0 {
			errText = all[errStart : errStart+i]
			break
		}
		select {
		case <-ctx.Done():
			p.close()
			return nil, ctx.Err()
		case <-p.errCh:
		case <-p.done:
			return nil, p.lostErr()
		}
	}
	if m := psqlErrLine.FindStringSubmatch(errText); m != nil {
		return nil, &pgconn.PgError{Severity: m[1], Code: m[2], Message: m[3]}
	}
	recs, err := csv.NewReader(strings.NewReader(out.String())).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("cannot read psql's answer to %q: %w", sql, err)
	}
	if len(recs) == 0 {
		return nil, pgx.ErrNoRows
	}
	return recs[0], nil
}

// lostErr is the error of a psql that has exited: the connection is gone.
// It says why with the last lines psql wrote on stderr.
func (p *psqlSession) lostErr() error {
	p.errMu.Lock()
	all := p.errBuf.String()
	p.errMu.Unlock()
	var last []string
	for _, l := range strings.Split(all, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, p.token) {
			last = append(last, l)
		}
	}
	if len(last) > 3 {
		last = last[len(last)-3:]
	}
	msg := strings.Join(last, "; ")
	if msg == "" {
		msg = "psql exited"
	}
	return fmt.Errorf("connection to the source lost (conn closed): %s", msg)
}

func (p *psqlSession) closed() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// close ends psql (and so the session); it waits for psql to exit.
func (p *psqlSession) close() {
	_ = p.stdin.Close()
	select {
	case <-p.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// inlineArgs replaces $1, $2... in sql with args as string literals: psql
// has no bind parameters before 16. Escape-string syntax keeps it right
// whatever standard_conforming_strings says; NUL cannot be in a literal.
func inlineArgs(sql string, args []string) string {
	for i := len(args); i >= 1; i-- {
		v := strings.ReplaceAll(args[i-1], "\x00", "")
		v = strings.ReplaceAll(strings.ReplaceAll(v, `\`, `\\`), "'", `\'`)
		sql = strings.ReplaceAll(sql, "$"+strconv.Itoa(i), "E'"+v+"'")
	}
	return sql
}

// useOwnerSession reports whether the backup session must run as the
// cluster's owner: pgfork is root, no --url says how to connect, and the
// owner is not root.
func useOwnerSession(connString, src string) (*instance.OSUser, bool) {
	if os.Geteuid() != 0 || connString != "" {
		return nil, false
	}
	u, err := DataDirOwner(src)
	if err != nil || u.UID == 0 {
		return nil, false
	}
	return u, true
}
