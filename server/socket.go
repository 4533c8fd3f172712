package server

// SocketParam is the query parameter of a hand-out or initialize request
// (`GET …/templates/{hash}/tests?socket=1`, `POST …/templates?socket=1`) by which a client asks for the
// managed server's Unix socket directory besides the TCP address (with a
// cluster per test, that cluster's own; Server.database adds it): a client
// on the same host that can reach that directory (it runs as the
// PostgreSQL OS user or as root: the directory is mode 0700 and the
// user's) connects there without a password, so without SCRAM's key
// derivation, which costs a debug build 0.2-0.3 s of CPU per connection
// (issue 33; docs/SECURITY.md, "Against other local users").
const SocketParam = "socket"
