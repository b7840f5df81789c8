package cmd

import (
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// adminTokenEnv is the environment variable of --admin-token.
const adminTokenEnv = "MC_ADMIN_TOKEN"

// adminTokenOptions are the bearer token of the master's admin HTTP API:
// a master asks it of every state-changing call (remove_all, drain jobs),
// and mc's admin clients send it.
type adminTokenOptions struct {
	Token     string
	TokenFile string
}

func (o *adminTokenOptions) addFlags(fs *pflag.FlagSet, usage string) {
	fs.StringVar(&o.Token, "admin-token", "", usage+" (visible in ps: prefer "+adminTokenEnv+" or --admin-token-file)")
	fs.StringVar(&o.TokenFile, "admin-token-file", "", "read the admin token from this file (its first line, surrounding blanks trimmed)")
	envName(fs, "admin-token", adminTokenEnv)
}

// token is the configured token, "" when none.
func (o adminTokenOptions) token() (string, error) {
	if o.TokenFile == "" {
		return o.Token, nil
	}
	if o.Token != "" {
		return "", usagef("--admin-token and --admin-token-file both give the admin token: give one")
	}
	b, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return "", inputErr("--admin-token-file", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	t := strings.TrimSpace(line)
	if t == "" {
		return "", usagef("--admin-token-file %s: the file is empty", o.TokenFile)
	}
	return t, nil
}
