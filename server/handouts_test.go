package server

import (
	"context"
	"net/http/httptest"
	"testing"
)

// TestGiveBackKeepsTheNextHandOut: the pool may hand a database given
// back on to a waiting test before the give-back's request ends (an
// unlocked database goes to the next waiter at once). The new holder's
// hand-out id must survive the end of the old one's give-back: the give-
// back used to end the database's hand-out after the pool call, which ended
// the new one, so its holder got 404 and the database stayed in use.
func TestGiveBackKeepsTheNextHandOut(t *testing.T) {
	s := &Server{}
	s.handouts.init()
	old := s.handouts.add("tpl", 3)
	var next string
	handOn := func(_ context.Context, hash string, id int) error {
		next = s.handouts.add(hash, id) // the waiter's GET, served meanwhile
		return nil
	}
	r := httptest.NewRequest("POST", "/api/v2/templates/tpl/tests/"+old+"/unlock", nil)
	r.SetPathValue("hash", "tpl")
	r.SetPathValue("id", old)
	w := httptest.NewRecorder()
	s.giveBack(v2, w, r, handOn)
	if w.Code != 204 {
		t.Fatalf("give-back: %d %s", w.Code, w.Body)
	}
	if id, ok := s.handouts.lookup("tpl", next); !ok || id != 3 {
		t.Errorf("the next holder's hand-out id is gone after the give-back (%d, %v)", id, ok)
	}
	if _, ok := s.handouts.lookup("tpl", old); ok {
		t.Error("the hand-out given back still gives the database back")
	}
}
