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

// LoadOperatorToken returns the operator token. With path set it reads
// that file, which must exist. Otherwise it reads dataDir/operator.token,
// first writing a new random token there (mode 0600) if there is none;
// created says so, for the caller to log the path (never the token). A
// token file readable by group or others is refused.
func LoadOperatorToken(path, dataDir string) (token, file string, created bool, err error) {
	if path != "" {
		token, err = readToken(path)
		return token, path, false, err
	}
	file = filepath.Join(dataDir, OperatorTokenFile)
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", file, false, fmt.Errorf("data directory %s is unusable: %w", dataDir, err)
	}
	token, err = readToken(file)
	if !errors.Is(err, fs.ErrNotExist) {
		return token, file, false, err
	}
	token, err = NewOperatorToken()
	if err != nil {
		return "", file, false, err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another process of the suite wrote it first: use theirs.
		token, err = readToken(file)
		return token, file, false, err
	}
	if err != nil {
		return "", file, false, fmt.Errorf("write operator token: %w", err)
	}
	_, werr := f.WriteString(token + "\n")
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		os.Remove(file)
		return "", file, false, fmt.Errorf("write operator token %s: %w", file, err)
	}
	return token, file, true, nil
}

func readToken(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if info.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("operator token file %s has mode %v; it must be readable by its owner only (chmod 600)", path, info.Mode().Perm())
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
