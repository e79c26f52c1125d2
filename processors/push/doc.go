// Package push is the mass-push system for public accounts (DESIGN.md
// section 1). Its parts live in sub-packages, one concept each:
//
//	numpkg  the number package: a job's converged, sorted target set
//	quota   per-user frequency control: 6 a day, released in windows
//	filter  the filter chain applied to a package before sending
package push
