package server

import (
	"net/http"

	"github.com/pgfork/pgfork/pool"
)

// SocketParam is the query parameter of a hand-out or initialize request
// (`GET …/templates/{hash}/tests?socket=1`, `POST …/templates?socket=1`) by which a client asks for the
// managed server's Unix socket directory besides the TCP address: a client
// on the same host that can reach that directory (it runs as the
// PostgreSQL OS user or as root: the directory is mode 0700 and the
// user's) connects there without a password, so without SCRAM's key
// derivation, which costs a debug build 0.2-0.3 s of CPU per connection
// (issue 33; docs/SECURITY.md, "Against other local users").
const SocketParam = "socket"

// withSocket adds a socket directory to d's config (socketDir) when the
// request asks for it with SocketParam: the shared server's
// (Config.SocketDir) for a database in it, the cluster's own for a test
// copy that is a cluster of its own (e.Port set: serve --copies clusters;
// its pg_hba trusts its socket too). Nothing changes for a client that
// does not ask: IntegreSQL's answer stays exactly its own.
func (s *Server) withSocket(r *http.Request, d database, e pool.Endpoint) database {
	if r.URL.Query().Get(SocketParam) != "1" {
		return d
	}
	dir := s.cfg.SocketDir
	if e.Port != 0 {
		dir = e.SocketDir
	}
	if dir != "" {
		d.Config.SocketDir = dir
	}
	return d
}
