package pgbin

// RealDir is realDir for the external tests.
var RealDir = realDir
