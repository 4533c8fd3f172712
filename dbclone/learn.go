package dbclone

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"sync"
	"time"
)

// Learning lets the advisor learn from the creations it observes: every
// Create is a measurement. For each strategy and template size class
// (powers of two of MiB) it keeps a running mean of ln(observed / model),
// the model being the estimate under the calibration in force, and scales
// later estimates by it, trusting it more with every observation. A
// strategy never observed is scaled by what the others showed (a slow
// machine is slow for every strategy), so the advisor's choice stays fair
// while it learns. Memory is bounded: at most one cell per strategy and
// size class. Safe for concurrent use. The zero value is ready to use.
type Learning struct {
	mu sync.Mutex
	// Base is the Source of the calibration the ratios are relative to:
	// observations under another calibration (after `db calibrate`)
	// start over.
	Base  string                `json:"base"`
	Cells map[string]*LearnCell `json:"cells"`
}

// LearnCell is what was observed for one strategy and size class.
type LearnCell struct {
	Strategy Strategy `json:"strategy"`
	// Class is the size class: templates of [2^(Class-1), 2^Class) MiB.
	Class int `json:"class"`
	// Total counts every observation.
	Total int `json:"total"`
	// N counts observations (capped at learnWindow: older ones fade).
	N int `json:"n"`
	// MeanLn is the running mean of ln(observed / model).
	MeanLn float64 `json:"mean_ln"`
	// Last is the latest observed time, for people reading the file.
	LastMS float64   `json:"last_ms"`
	At     time.Time `json:"at"`
}

// learnWindow is how many recent observations the running mean follows
// (an exponential moving average once N reaches it).
const learnWindow = 8

// maxSizeClass bounds the size classes (2^40 MiB is beyond any template).
const maxSizeClass = 40

func sizeClass(bytes int64) int {
	return min(bits.Len64(uint64(max(bytes, 0)>>20)), maxSizeClass)
}

func cellKey(s Strategy, class int) string { return string(s) + "/" + strconv.Itoa(class) }

// Observe records that copying a template of templateBytes by strategy s
// took observed where the model (under the calibration base) estimated
// model.
func (l *Learning) Observe(base string, s Strategy, templateBytes int64, model, observed time.Duration) {
	if l == nil || model <= 0 || observed <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resetFor(base)
	class := sizeClass(templateBytes)
	key := cellKey(s, class)
	c := l.Cells[key]
	if c == nil {
		c = &LearnCell{Strategy: s, Class: class}
		l.Cells[key] = c
	}
	c.Total++
	x := math.Log(float64(observed) / float64(model))
	c.N = min(c.N+1, learnWindow)
	c.MeanLn += (x - c.MeanLn) / float64(c.N)
	c.LastMS, c.At = float64(observed)/float64(time.Millisecond), time.Now().UTC()
}

// resetFor starts over when the calibration changed. Called with l.mu held.
func (l *Learning) resetFor(base string) {
	if l.Cells == nil || l.Base != base {
		l.Base, l.Cells = base, map[string]*LearnCell{}
	}
}

// factor returns how much to scale the model's estimate for strategy s and
// a template of templateBytes, and the number of observations behind it.
func (l *Learning) factor(base string, s Strategy, templateBytes int64) (float64, int) {
	if l == nil {
		return 1, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Base != base {
		return 1, 0
	}
	if c := l.Cells[cellKey(s, sizeClass(templateBytes))]; c != nil {
		return trust(c.MeanLn, c.N), c.N
	}
	// Nothing for this size: the strategy's other sizes, else every
	// strategy's, weighted by their observations.
	for _, only := range []bool{true, false} {
		var sum float64
		var n int
		for _, c := range l.Cells {
			if only && c.Strategy != s {
				continue
			}
			sum += c.MeanLn * float64(c.N)
			n += c.N
		}
		if n > 0 {
			return trust(sum/float64(n), min(n, learnWindow)), n
		}
	}
	return 1, 0
}

// trust blends the mean log ratio in by n/(n+½): one observation moves the
// estimate two thirds of the way (in ratio) toward it, eight nearly all
// the way.
func trust(meanLn float64, n int) float64 {
	w := float64(n) / (float64(n) + 0.5)
	return math.Exp(w * meanLn)
}

// Observations returns how many creations have been observed under base.
func (l *Learning) Observations(base string) int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Base != base {
		return 0
	}
	n := 0
	for _, c := range l.Cells {
		n += c.Total
	}
	return n
}

// MarshalJSON encodes the learning under its lock.
func (l *Learning) MarshalJSON() ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	type plain struct {
		Base  string                `json:"base"`
		Cells map[string]*LearnCell `json:"cells"`
	}
	return json.Marshal(plain{l.Base, l.Cells})
}

// UnmarshalJSON decodes a learning, dropping cells it does not understand
// and keeping at most one per strategy and size class.
func (l *Learning) UnmarshalJSON(b []byte) error {
	var p struct {
		Base  string                `json:"base"`
		Cells map[string]*LearnCell `json:"cells"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Base, l.Cells = p.Base, map[string]*LearnCell{}
	for _, s := range Strategies {
		for class := 0; class <= maxSizeClass; class++ {
			k := cellKey(s, class)
			if c := p.Cells[k]; c != nil && c.N > 0 && c.N <= learnWindow && !math.IsNaN(c.MeanLn) && !math.IsInf(c.MeanLn, 0) {
				c.Strategy, c.Class, c.Total = s, class, max(c.Total, c.N)
				l.Cells[k] = c
			}
		}
	}
	return nil
}

// describe says how an estimate was learned, for the advice's reasons.
func (l *Learning) describe(base string) string {
	n := l.Observations(base)
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("estimates scaled by what %d observed creations took", n)
}
