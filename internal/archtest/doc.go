// Package archtest holds a test that keeps the package layers of
// docs/ARCHITECTURE.md true: a package imports only from lower layers.
package archtest
