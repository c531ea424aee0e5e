package s3

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// credentialsRefresh is how long credentials read from files are cached:
// a rotated Secret is picked up within this time.
const credentialsRefresh = time.Minute

// secretSource reads credentials from files or environment variables at
// every Retrieve (the SDK caches them through aws.CredentialsCache). Its
// errors name the file or variable, never its content.
type secretSource struct {
	idFile, secretFile, tokenFile string
	idEnv, secretEnv, tokenEnv    string
}

func (s secretSource) Retrieve(context.Context) (aws.Credentials, error) {
	var c aws.Credentials
	var err error
	if s.idFile != "" {
		if c.AccessKeyID, err = readSecretFile("access key ID", s.idFile); err != nil {
			return c, err
		}
		if c.SecretAccessKey, err = readSecretFile("secret access key", s.secretFile); err != nil {
			return c, err
		}
		if s.tokenFile != "" {
			if c.SessionToken, err = readSecretFile("session token", s.tokenFile); err != nil {
				return c, err
			}
		}
		c.Source = "etcdbackup-s3-files"
	} else {
		if c.AccessKeyID, err = readSecretEnv("access key ID", s.idEnv); err != nil {
			return c, err
		}
		if c.SecretAccessKey, err = readSecretEnv("secret access key", s.secretEnv); err != nil {
			return c, err
		}
		if s.tokenEnv != "" {
			if c.SessionToken, err = readSecretEnv("session token", s.tokenEnv); err != nil {
				return c, err
			}
		}
		c.Source = "etcdbackup-s3-env"
	}
	c.CanExpire = true
	c.Expires = time.Now().Add(credentialsRefresh)
	return c, nil
}

func readSecretFile(what, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is printed once, below
		}
		return "", fmt.Errorf("read S3 %s from file %q: %w", what, path, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("S3 %s file %q is empty", what, path)
	}
	return v, nil
}

func readSecretEnv(what, name string) (string, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return "", fmt.Errorf("S3 %s: environment variable %s is not set or empty", what, name)
	}
	return v, nil
}
