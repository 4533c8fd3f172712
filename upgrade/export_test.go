package upgrade

// SetHookBeforeStop sets the function run after an online rehearsal and
// before the old cluster is stopped; it returns a function that unsets it.
func SetHookBeforeStop(f func()) func() {
	hookBeforeStop = f
	return func() { hookBeforeStop = nil }
}
