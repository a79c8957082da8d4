package artifactfs

import "os"

// SetSync replaces the fsync of files and directories (a test-only seam).
func (f *FS) SetSync(sync func(*os.File) error) { f.sync = sync }
