package server

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Wrong tokens a remote address may send per authWindow before it is
// answered 429 until the window has passed: a handful of guesses a minute,
// against a token of 16 or more URL-safe characters.
const (
	authFailuresAllowed = 10
	authWindow          = time.Minute
	authTrackedMax      = 4096 // addresses remembered at most
)

// authFailures counts wrong tokens per remote address.
type authFailures struct {
	mu   sync.Mutex
	seen map[string]*failWindow
}

type failWindow struct {
	start time.Time
	n     int
}

// fail records a wrong token from ip and returns how long the address must
// wait before it is answered again (0: answer 401 as usual).
func (a *authFailures) fail(ip string) time.Duration {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = map[string]*failWindow{}
	}
	w := a.seen[ip]
	if w == nil || now.Sub(w.start) >= authWindow {
		if len(a.seen) >= authTrackedMax {
			for k, v := range a.seen {
				if now.Sub(v.start) >= authWindow {
					delete(a.seen, k)
				}
			}
		}
		w = &failWindow{start: now}
		a.seen[ip] = w
	}
	w.n++
	if w.n > authFailuresAllowed {
		return authWindow - now.Sub(w.start)
	}
	return 0
}

// remoteIP is the address part of r.RemoteAddr ("" for a Unix socket).
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	return host
}
