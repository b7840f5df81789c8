package cmd

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
)

// writeFileWith writes path through write in one rename, so that a reader
// never sees half a file and a failed write leaves the old one. The file
// gets the mode any command's new file gets, 0666 less the umask (0644
// typically), or path's own permission bits when it exists: these are
// outputs (a value, a plot, a load trace, a priority matrix), not secrets.
//
// An existing path that is no regular file (/dev/null, a FIFO, or a
// symlink such as /dev/stdout) is written in place, through the link: a
// rename would replace the device or the link itself (as root, /dev/null
// and /dev/stdout became plain files).
func writeFileWith(path string, write func(*os.File) error) error {
	if st, err := os.Lstat(path); err == nil && !st.Mode().IsRegular() {
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			return fmt.Errorf("%s is a directory: give a file to write", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return err
		}
		if err := write(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	tmp, err := createBeside(path)
	if err != nil {
		return namePath(path, err)
	}
	if err := write(tmp); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return namePath(path, err)
	}
	return nil
}

// namePath says what went wrong with path itself: the file system's
// error names the hidden file beside it that the write goes through,
// which the user never gave.
func namePath(path string, err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	return fmt.Errorf("write %s: %w", path, err)
}

// inputErr is the error of reading an input the user named (flag, or an
// argument): one that is not there, is a directory or is empty is the
// caller's mistake, a usage error (as --config's is); anything else (a
// permission, an I/O error) is a failure.
func inputErr(flag string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTDIR) {
		return usagef("%s: %w", flag, err)
	}
	return fmt.Errorf("%s: %w", flag, err)
}

// checkOutput makes sure a file can be written at path (its directory
// exists and takes a new file) before the work whose result goes there:
// a benchmark or a simulation must not run for minutes and then lose
// its results to a typo in an output path. flag names the option.
func checkOutput(flag, path string) error {
	if path == "" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return usagef("%s %s: is a directory, want a file", flag, path)
	}
	f, err := createBeside(path)
	if err != nil {
		return usagef("%s: %w", flag, namePath(path, err))
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// writeFileAtomic is writeFileWith for bytes in hand.
func writeFileAtomic(path string, data []byte) error {
	return writeFileWith(path, func(f *os.File) error { _, err := f.Write(data); return err })
}

// createBeside creates a new file in path's directory for writeFileWith.
// os.CreateTemp would make it 0600 whatever the umask; O_EXCL with 0666
// lets the kernel apply the umask.
func createBeside(path string) (*os.File, error) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	for range 100 {
		name := filepath.Join(dir, fmt.Sprintf(".%s.%08x.tmp", base, rand.Uint32()))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
			if err := f.Chmod(st.Mode().Perm()); err != nil {
				f.Close()
				os.Remove(name)
				return nil, err
			}
		}
		return f, nil
	}
	return nil, fmt.Errorf("create a file beside %s: no free name", path)
}
