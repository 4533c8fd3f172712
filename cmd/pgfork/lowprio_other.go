//go:build !linux

package main

// lowerPriority does nothing here.
func lowerPriority() {}
