package clusterstore

// SetTestHookBeforeFill sets testHookBeforeFill for the external tests.
func SetTestHookBeforeFill(f func(data string, template uint32)) { testHookBeforeFill = f }
