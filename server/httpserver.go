package server

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// HTTPOptions bound what a client may hold of the server: every limit has
// a default, so a hostile or broken client cannot keep connections (and
// file descriptors) forever.
type HTTPOptions struct {
	// ReadHeaderTimeout bounds reading a request's headers (default 10 s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included (default 30 s).
	ReadTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long (default 60 s).
	IdleTimeout time.Duration
	// LongestWait is the longest a handler may legitimately wait (a test
	// request waits for finalize and then for a ready database); the write
	// timeout is this plus 30 s so that such waits are never cut (default 2 min).
	LongestWait time.Duration
	// MaxConns caps open connections; more wait to be accepted (default 512).
	MaxConns int
	// Allowed, when set, says which remote addresses the server admits
	// (Server.AllowsIP): others may hold at most a quarter of MaxConns
	// between them, so that rejected clients cannot take every slot.
	Allowed func(net.IP) bool
}

// DefaultMaxConns is the default cap on open HTTP connections.
const DefaultMaxConns = 512

func (o HTTPOptions) withDefaults() HTTPOptions {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 10 * time.Second
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 30 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 60 * time.Second
	}
	if o.LongestWait <= 0 {
		o.LongestWait = 2 * time.Minute
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	return o
}

// NewHTTPServer returns an http.Server for h with o's timeouts. Serve it on
// a listener from LimitListener(l, o.MaxConns) to cap connections too.
func NewHTTPServer(h http.Handler, o HTTPOptions) *http.Server {
	o = o.withDefaults()
	return &http.Server{Handler: h,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		ReadTimeout:       o.ReadTimeout,
		IdleTimeout:       o.IdleTimeout,
		WriteTimeout:      o.LongestWait + 30*time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}

// Listen wraps l so that at most o.MaxConns connections are open at once;
// further ones wait in the kernel's backlog until one closes.
func (o HTTPOptions) Listen(l net.Listener) net.Listener {
	o = o.withDefaults()
	ll := LimitListener(l, o.MaxConns).(*limitListener)
	ll.allowed = o.Allowed
	return ll
}

// perAddrExempt: connections from the machine itself (loopback) are not
// capped per address, as every local client (test workers, the CLI)
// shares 127.0.0.1.
func perAddrExempt(ip net.IP) bool { return ip.IsLoopback() }

// LimitListener returns a listener that accepts at most n connections at a
// time (Accept waits while n are open), at most PerAddr(n) of them from
// one remote address: a connection beyond that is closed at once, so one
// client cannot hold every slot (issue 19, F12).
func LimitListener(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{}), n: n,
		perAddr: PerAddr(n), byAddr: map[string]int{}, exempt: perAddrExempt}
}

// PerAddr is how many connections one remote address may hold of n.
func PerAddr(n int) int { return max(4, n/8) }

type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	n         int
	perAddr   int
	allowed   func(net.IP) bool
	exempt    func(net.IP) bool // not capped per address

	mu      sync.Mutex
	byAddr  map[string]int
	refused int // connections from addresses allowed() refuses
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			return nil, err
		}
		addr, stranger := "", false
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			addr = ta.IP.String()
			stranger = l.allowed != nil && !l.allowed(ta.IP)
		}
		l.mu.Lock()
		capped := addr != "" && !l.exempt(c.RemoteAddr().(*net.TCPAddr).IP)
		full := capped && l.byAddr[addr] >= l.perAddr || stranger && l.refused >= max(1, l.n/4)
		if !full && addr != "" {
			l.byAddr[addr]++
			if stranger {
				l.refused++
			}
		}
		l.mu.Unlock()
		if full {
			c.Close()
			<-l.sem
			continue
		}
		return &limitConn{Conn: c, release: func() {
			if addr != "" {
				l.mu.Lock()
				if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
					delete(l.byAddr, addr)
				}
				if stranger {
					l.refused--
				}
				l.mu.Unlock()
			}
			<-l.sem
		}}, nil
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
