package server

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
)

// handouts maps the native API's unguessable hand-out ids to test
// databases. Only the newest hand-out of a database has an id; giving the
// database back (through either API), discarding its template or a reset
// ends it. Ids live in memory: after a restart every old id is a 404.
type handouts struct {
	mu    sync.Mutex
	byTok map[string]handout
	byDB  map[handout]string
}

type handout struct {
	hash string
	id   int
}

func (h *handouts) init() {
	h.mu.Lock()
	h.byTok, h.byDB = map[string]handout{}, map[handout]string{}
	h.mu.Unlock()
}

// add records a hand-out of database id of hash and returns its new id.
func (h *handouts) add(hash string, id int) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	tok := hex.EncodeToString(b)
	h.mu.Lock()
	defer h.mu.Unlock()
	k := handout{hash, id}
	if old, ok := h.byDB[k]; ok {
		delete(h.byTok, old)
	}
	h.byTok[tok], h.byDB[k] = k, tok
	return tok
}

// lookup returns the database of hand-out tok of hash.
func (h *handouts) lookup(hash, tok string) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k, ok := h.byTok[tok]
	if !ok || k.hash != hash {
		return 0, false
	}
	return k.id, true
}

// end forgets the hand-out of database id of hash, if any.
func (h *handouts) end(hash string, id int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := handout{hash, id}
	if tok, ok := h.byDB[k]; ok {
		delete(h.byTok, tok)
		delete(h.byDB, k)
	}
}

// forgetHash forgets every hand-out of template hash.
func (h *handouts) forgetHash(hash string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, tok := range h.byDB {
		if k.hash == hash {
			delete(h.byTok, tok)
			delete(h.byDB, k)
		}
	}
}
