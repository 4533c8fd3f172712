//go:build !linux

package volume

import (
	"context"

	"github.com/pgfork/pgfork/internal/errs"
)

func unsupported() error {
	return errs.New(errs.Unsupported, "reflink volumes need Linux (loop devices)")
}

// NeedRoot is the error for a caller that is not root.
func NeedRoot(cmd string) error { return unsupported() }

// Create is Linux only.
func Create(context.Context, string, Options, bool) (*Record, error) { return nil, unsupported() }

// Attach is Linux only.
func Attach(context.Context, string) (*Record, error) { return nil, unsupported() }

// Remove is Linux only.
func Remove(context.Context, string) error { return unsupported() }

// Grow is Linux only.
func Grow(context.Context, string, int64) (*Record, error) { return nil, unsupported() }

// Stat reads the record; nothing is ever attached here.
func Stat(base string) (*Status, error) {
	r, err := Load(base)
	if err != nil {
		return nil, err
	}
	return &Status{Record: *r}, nil
}

// Attached is false: no loop devices here.
func (r *Record) Attached() bool { return false }

// Unmount is Linux only.
func (r *Record) Unmount() error { return unsupported() }

// Measure is Linux only.
func Measure(context.Context, string) (*Speedup, error) { return nil, unsupported() }
