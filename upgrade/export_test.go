package upgrade

// SetHookBeforeStop sets the function run after an online rehearsal and
// before the old cluster is stopped; it returns a function that unsets it.
func SetHookBeforeStop(f func()) func() {
	hookBeforeStop = f
	return func() { hookBeforeStop = nil }
}

// SetTestHook sets the function called at the named steps of a run (see
// testHook); it returns a function that unsets it.
func SetTestHook(f func(step string)) func() {
	testHook = f
	return func() { testHook = nil }
}
