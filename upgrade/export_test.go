package upgrade

// SetHookBeforeStop sets the function run after an online rehearsal and
// before the old cluster is stopped; it returns a function that unsets it.
func SetHookBeforeStop(f func()) func() {
	hookBeforeStop = f
	return func() { hookBeforeStop = nil }
}

// SetHookAfterTransfer sets the function run after pg_upgrade and before
// the new cluster is started and checked; it returns a function that
// unsets it.
func SetHookAfterTransfer(f func()) func() {
	hookAfterTransfer = f
	return func() { hookAfterTransfer = nil }
}
