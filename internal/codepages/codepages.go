// Package codepages gives back to the kernel the pages of the manager's own binary that only
// start-up used, and has the rest read page by page.
//
// Why: Linux reads an executable's pages in large read-ahead chunks, into large folios on file
// systems that support them (ext4, xfs), and a fault maps a whole folio. Measured on this project's
// machines (kernel 6.18, ext4): touching one byte every 256 KiB of the 117 MB manager binary maps
// 95 MB; after MADV_RANDOM and MADV_PAGEOUT the same touches map 1.9 MB. The manager's package
// initializers (Kubernetes' scheme, govmomi's and the AWS SDK's type registries, CEL) touch pages
// across the whole binary once, so without this the binary alone holds 58-70 MiB of RSS (and of
// its container's page cache), whatever the controllers do afterwards.
package codepages

// Result is what Release did.
type Result struct {
	// Ranges is the number of the binary's read-only mappings advised.
	Ranges int
	// FileBefore and FileAfter are the process's file-backed resident bytes (RssFile) around the
	// call.
	FileBefore, FileAfter int64
}
