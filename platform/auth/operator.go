package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// OperatorTokenFile is the operator token's file name in the data
// directory.
const OperatorTokenFile = "operator.token"

// LoadOperatorToken returns the operator token, read from path, or from
// dataDir/operator.token when path is empty. A missing file is first
// written with a new random token (mode 0600; when several processes
// start together, the first one's token is the one they all read); created
// says so, for the caller to log the path (never the token). A token file
// others may read, or anyone but its owner may write, is refused; its
// group may read it, as Kubernetes mounts a Secret for the pod's fsGroup.
func LoadOperatorToken(path, dataDir string) (token, file string, created bool, err error) {
	file = path
	if file == "" {
		file = filepath.Join(dataDir, OperatorTokenFile)
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return "", file, false, fmt.Errorf("data directory %s is unusable: %w", dataDir, err)
		}
	}
	token, err = readToken(file)
	if !errors.Is(err, fs.ErrNotExist) {
		return token, file, false, err
	}
	token, err = NewOperatorToken()
	if err != nil {
		return "", file, false, err
	}
	// Written whole to a temporary file, then linked into place, which
	// fails if the file exists: a process starting at the same moment
	// reads either no file or the whole token, never half of one.
	tmp, err := os.CreateTemp(filepath.Dir(file), ".operator.token-*")
	if err != nil {
		return "", file, false, fmt.Errorf("write operator token: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(token + "\n")
	if err := errors.Join(werr, tmp.Chmod(0o600), tmp.Sync(), tmp.Close()); err != nil {
		return "", file, false, fmt.Errorf("write operator token %s: %w", file, err)
	}
	err = os.Link(tmp.Name(), file)
	if errors.Is(err, fs.ErrExist) {
		// Another process wrote it first: use theirs.
		token, err = readToken(file)
		return token, file, false, err
	}
	if err != nil {
		return "", file, false, fmt.Errorf("write operator token %s: %w", file, err)
	}
	return token, file, true, nil
}

func readToken(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if info.Mode().Perm()&0o037 != 0 {
		return "", fmt.Errorf("operator token file %s has mode %v; only its owner may write it and only its owner and group read it (chmod 600)", path, info.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(b))
	if !validOperatorToken(token) {
		return "", fmt.Errorf("operator token file %s does not hold a token of the form %s followed by 43 base64url characters", path, OperatorPrefix)
	}
	return token, nil
}
