package grant

// SetAfterClaims sets the hook run between a batch's claims and its
// produce (the crash test exits there).
func SetAfterClaims(f func()) { afterClaims = f }
