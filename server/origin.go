package server

import (
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Browsers are clients too: a web page the developer visits can send
// requests to serve on 127.0.0.1 (issue 32, F13). Two checks keep it out.
//
//   - DNS rebinding: a page at http://evil.example:5000 whose name is made to
//     resolve to 127.0.0.1 reads serve's answers as its own. Its requests
//     name evil.example in Host, so a request admitted without a token must
//     name the server by a loopback name, an IP address or a name the
//     operator allowed (Config.AllowedHosts); else 421. A request that
//     carries the token is not affected: the page does not know it.
//   - Cross-site requests: a page anywhere can POST to http://127.0.0.1:5000
//     (no preflight for a text/plain body). Browsers name the page's origin
//     in Origin: a state-changing request whose Origin is not the server's
//     own is refused with 403, token or not; so is any request a browser
//     marks Sec-Fetch-Site: cross-site (a GET hands out a database), but
//     for the page, /healthz and the OpenAPI document.
//
// And no page may frame serve's (clickjacking, F14): every answer says so.

// securityHeaders are sent with every answer: no framing by any page, no
// sniffing of JSON as HTML.
func securityHeaders(h http.Header) {
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
}

// hostAllowed reports whether a request's Host names this server: a
// loopback name (localhost, *.localhost), an IP address (a browser that
// sends one has connected to that very address, so no other site's page
// is behind it), or one of Config.AllowedHosts ("*": any).
func (s *Server) hostAllowed(hostport string) bool {
	host := hostOnly(hostport)
	if host == "" {
		// HTTP/1.0 without Host, or a Unix socket client: no browser.
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil {
		return true
	}
	for _, a := range s.cfg.AllowedHosts {
		if a == "*" || strings.EqualFold(strings.TrimSuffix(a, "."), host) {
			return true
		}
	}
	return false
}

// hostOnly is the lower-case host of a Host header value, without port,
// brackets or a trailing dot.
func hostOnly(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	return strings.ToLower(host)
}

// stateChanging are the methods a cross-site page must not send.
func stateChanging(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// crossSite reports whether a browser says that another site's page sent r
// (Sec-Fetch-Site, sent by every current browser with every request; no
// other client sends it).
func crossSite(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Sec-Fetch-Site"), "cross-site")
}

// sameOrigin reports whether r's Origin header, if any, is the server's
// own: the same host as the request's Host (and the same port when both
// name one, so that a TLS proxy in front, whose Origin is https without a
// port, still matches), or a name of Config.AllowedHosts (a proxy that
// rewrites Host). No Origin (curl, the CLI, every non-browser client) is
// fine.
func (s *Server) sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false // "null" (a sandboxed frame, a file:// page) and garbage
	}
	oh := hostOnly(u.Host)
	if oh == hostOnly(r.Host) {
		op, hp := u.Port(), portOf(r.Host)
		return op == "" || hp == "" || op == hp
	}
	for _, a := range s.cfg.AllowedHosts {
		if a != "*" && strings.EqualFold(strings.TrimSuffix(a, "."), oh) {
			return true
		}
	}
	return false
}

func portOf(hostport string) string {
	if _, p, err := net.SplitHostPort(hostport); err == nil {
		return p
	}
	return ""
}
