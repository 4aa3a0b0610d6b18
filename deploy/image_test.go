package deploy_test

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// ociDescriptor, ociIndex, ociManifest and ociConfig are the parts of the
// OCI image spec the test reads, decoded with the standard library alone
// so it checks tools/mkimage's output independently of the library that
// wrote it.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type ociIndex struct {
	Manifests []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	MediaType string          `json:"mediaType"`
	Config    ociDescriptor   `json:"config"`
	Layers    []ociDescriptor `json:"layers"`
}

type ociConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User         string              `json:"User"`
		Env          []string            `json:"Env"`
		Entrypoint   []string            `json:"Entrypoint"`
		Cmd          []string            `json:"Cmd"`
		WorkingDir   string              `json:"WorkingDir"`
		ExposedPorts map[string]struct{} `json:"ExposedPorts"`
		Labels       map[string]string   `json:"Labels"`
	} `json:"config"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, v))
}

func blobPath(layout, digest string) string {
	algo, hex, _ := strings.Cut(digest, ":")
	return filepath.Join(layout, "blobs", algo, hex)
}

// writeImage runs `make image`'s writer, tools/mkimage, on freshly built
// static binaries and returns the OCI layout and the docker-archive.
func writeImage(t *testing.T) (layout, tarPath string) {
	t.Helper()
	bin, err := staticBin()
	require.NoError(t, err)
	out := t.TempDir()
	layout, tarPath = filepath.Join(out, "oci"), filepath.Join(out, "jsbridge.tar")
	cmd := exec.Command("go", "-C", filepath.Join(repoRoot, "tools", "mkimage"), "run", ".",
		"-bin", bin, "-platforms", "linux/"+runtime.GOARCH, "-tag", "jsbridge:test",
		"-version", "v9.9.9", "-revision", "abc123", "-layout", layout, "-tarball", tarPath)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "mkimage: %s", b)
	return layout, tarPath
}

// readImage reads the layout's one image: its descriptor in index.json,
// its manifest (one layer) and its config.
func readImage(t *testing.T, layout string) (ociDescriptor, ociManifest, ociConfig) {
	t.Helper()
	var idx ociIndex
	readJSON(t, filepath.Join(layout, "index.json"), &idx)
	require.Len(t, idx.Manifests, 1)
	d := idx.Manifests[0]
	var m ociManifest
	readJSON(t, blobPath(layout, d.Digest), &m)
	require.Len(t, m.Layers, 1, "one layer")
	var cfg ociConfig
	readJSON(t, blobPath(layout, m.Config.Digest), &cfg)
	return d, m, cfg
}

// `make image`'s writer, run on freshly built static binaries, gives an
// OCI layout whose one image runs as 65532:65532, has no entrypoint, runs
// `bridge --help` by default, and holds exactly the binaries, the CA
// certificates, /etc/passwd and /etc/group, /data and /tmp; and a
// docker-archive tarball of the same image under its tag. The binaries
// taken back out of the layer run and print their version.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and the image")
	}
	t.Parallel()
	layout, tarPath := writeImage(t)

	d, m, cfg := readImage(t, layout)
	require.Equal(t, "application/vnd.oci.image.manifest.v1+json", d.MediaType)
	require.Equal(t, "test", d.Annotations["org.opencontainers.image.ref.name"])
	require.Equal(t, "linux", d.Platform.OS)
	require.Equal(t, "linux", cfg.OS)
	require.Equal(t, runtime.GOARCH, cfg.Architecture)
	require.Equal(t, "65532:65532", cfg.Config.User)
	require.Empty(t, cfg.Config.Entrypoint)
	require.Equal(t, []string{"bridge", "--help"}, cfg.Config.Cmd)
	require.Contains(t, cfg.Config.Env, "PATH=/usr/local/bin")
	require.Equal(t, "/data", cfg.Config.WorkingDir)
	require.Contains(t, cfg.Config.ExposedPorts, "9464/tcp")
	require.Contains(t, cfg.Config.ExposedPorts, "9465/tcp")
	require.Equal(t, "v9.9.9", cfg.Config.Labels["org.opencontainers.image.version"])
	require.Equal(t, "abc123", cfg.Config.Labels["org.opencontainers.image.revision"])

	// The layer: exactly these entries, the binaries static and runnable.
	f, err := os.Open(blobPath(layout, m.Layers[0].Digest))
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	var names []string
	extracted := t.TempDir()
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		switch h.Name {
		case "usr/local/bin/bridge", "usr/local/bin/consumer":
			require.Equal(t, int64(0o755), h.Mode&0o777, h.Name)
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(extracted, filepath.Base(h.Name)), data, 0o755))
		case "etc/passwd":
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.Contains(t, string(data), "nonroot:x:65532:65532:nonroot:/data:/sbin/nologin\n")
		case "etc/ssl/certs/ca-certificates.crt":
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.Contains(t, string(data), "-----BEGIN CERTIFICATE-----")
		case "data/":
			require.Equal(t, 65532, h.Uid, "the user's home is its own")
		case "tmp/":
			require.Equal(t, int64(0o1777), h.Mode&0o7777)
		}
	}
	slices.Sort(names)
	require.Equal(t, []string{
		"data/", "etc/", "etc/group", "etc/passwd", "etc/ssl/", "etc/ssl/certs/", "etc/ssl/certs/ca-certificates.crt",
		"tmp/", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/bridge", "usr/local/bin/consumer",
	}, names)
	for _, b := range []string{"bridge", "consumer"} {
		out, err := exec.Command(filepath.Join(extracted, b), "--version").CombinedOutput()
		require.NoError(t, err, "%s --version: %s", b, out)
		require.True(t, strings.HasPrefix(string(out), b+" "), "%s --version: %s", b, out)
	}

	// The docker-archive names the image by its tag.
	tf, err := os.Open(tarPath)
	require.NoError(t, err)
	defer tf.Close()
	tr = tar.NewReader(tf)
	var manifest []struct {
		RepoTags []string `json:"RepoTags"`
	}
	for {
		h, err := tr.Next()
		require.NoError(t, err, "no manifest.json in the docker-archive")
		if h.Name == "manifest.json" {
			require.NoError(t, json.NewDecoder(tr).Decode(&manifest))
			break
		}
	}
	require.Equal(t, []string{"jsbridge:test"}, manifest[0].RepoTags)
}
