package pgclone

// SetTestHookBeforeWAL sets testHookBeforeWAL for the external tests.
func SetTestHookBeforeWAL(f func(staging string)) { testHookBeforeWAL = f }
