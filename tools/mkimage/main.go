// Command mkimage writes jsbridge's container image without a container
// engine: an OCI image layout (a directory any OCI tool reads: skopeo,
// crane, podman, containerd, `docker load` of its tar) and a
// docker-archive tarball (`docker load -i`, `podman load -i`), from
// binaries already built with CGO_ENABLED=0.
//
// The image holds one layer: /usr/local/bin/bridge and
// /usr/local/bin/consumer, the CA certificates of the build machine
// (/etc/ssl/certs/ca-certificates.crt), an /etc/passwd and /etc/group
// naming the non-root user nonroot (65532:65532), its home /data (the
// working directory) and /tmp. Nothing else: no shell, no libc, no
// package manager. It runs as 65532:65532; the command is the binary's
// name, e.g. `bridge run …` or `consumer run …` (Cmd defaults to
// `bridge --help`).
//
// `make image` runs it; see docs/install.md.
//
// It lives in its own module so go-containerregistry never enters the
// dependency graph of applications importing jsbridge.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's user: the conventional non-root id of distroless images.
const (
	uid      = 65532
	userName = "nonroot"
	home     = "/data"
)

// binaries are the files of /usr/local/bin, built per platform into
// <bin>/<os>_<arch>/.
var binaries = []string{"bridge", "consumer"}

type options struct {
	bin       string   // directory of <os>_<arch>/{bridge,consumer}
	platforms []string // os/arch, e.g. linux/amd64
	tag       string   // image reference written into the tarball and the layout's ref.name
	version   string   // org.opencontainers.image.version
	revision  string   // org.opencontainers.image.revision
	created   time.Time
	caCerts   string // PEM bundle copied to /etc/ssl/certs/ca-certificates.crt
	layoutDir string // OCI image layout output ("" skips it)
	tarPath   string // docker-archive output of the first platform ("" skips it)
}

func main() {
	var o options
	var platforms, created string
	flag.StringVar(&o.bin, "bin", "dist/image/bin", "directory holding <os>_<arch>/bridge and <os>_<arch>/consumer, built with CGO_ENABLED=0")
	flag.StringVar(&platforms, "platforms", "linux/amd64", "space- or comma-separated os/arch list; the tarball holds the first")
	flag.StringVar(&o.tag, "tag", "jsbridge:dev", "image reference, e.g. ghcr.io/jsbridge/jsbridge:v0.3.0")
	flag.StringVar(&o.version, "version", "dev", "version label")
	flag.StringVar(&o.revision, "revision", "", "commit label")
	flag.StringVar(&created, "created", "", "creation time, RFC 3339 (default: 1970-01-01T00:00:00Z, so a rebuild of the same binaries is byte-identical)")
	flag.StringVar(&o.caCerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA certificate bundle (PEM) to ship")
	flag.StringVar(&o.layoutDir, "layout", "dist/image/oci", "OCI image layout directory to write (replaced); empty skips it")
	flag.StringVar(&o.tarPath, "tarball", "dist/image/jsbridge.tar", "docker-archive tarball to write; empty skips it")
	flag.Parse()
	o.platforms = strings.FieldsFunc(platforms, func(r rune) bool { return r == ',' || r == ' ' })
	o.created = time.Unix(0, 0).UTC()
	if created != "" {
		t, err := time.Parse(time.RFC3339, created)
		if err != nil {
			fail(fmt.Errorf("-created %q: %w", created, err))
		}
		o.created = t.UTC()
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mkimage:", err)
	os.Exit(1)
}

// tagChars is what a tag may not hold (a git describe of a dirty tree is
// fine; "(devel)" is not).
var tagChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

func run(o options) error {
	if len(o.platforms) == 0 {
		return errors.New("-platforms is empty")
	}
	repo, tagPart, _ := strings.Cut(o.tag, ":")
	if tagPart == "" {
		tagPart = "latest"
	}
	tag, err := name.NewTag(repo+":"+strings.TrimLeft(tagChars.ReplaceAllString(tagPart, "-"), ".-"), name.WeakValidation)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", o.tag, err)
	}
	certs, err := os.ReadFile(o.caCerts)
	if err != nil {
		return fmt.Errorf("-ca-certs: %w", err)
	}
	var images []v1.Image
	for _, p := range o.platforms {
		goos, arch, ok := strings.Cut(p, "/")
		if !ok {
			return fmt.Errorf("-platforms: %q is not os/arch", p)
		}
		img, err := image(o, goos, arch, certs)
		if err != nil {
			return fmt.Errorf("image for %s: %w", p, err)
		}
		images = append(images, img)
	}
	if o.layoutDir != "" {
		if err := os.RemoveAll(o.layoutDir); err != nil {
			return err
		}
		lp, err := layout.Write(o.layoutDir, empty.Index)
		if err != nil {
			return fmt.Errorf("-layout %s: %w", o.layoutDir, err)
		}
		// The top-level index.json names one image per platform, tagged,
		// so `podman load`/skopeo find it by ref.name.
		for i, img := range images {
			goos, arch, _ := strings.Cut(o.platforms[i], "/")
			if err := lp.AppendImage(img,
				layout.WithPlatform(v1.Platform{OS: goos, Architecture: arch}),
				layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag.TagStr()})); err != nil {
				return fmt.Errorf("-layout %s: %w", o.layoutDir, err)
			}
		}
		fmt.Println("mkimage: wrote OCI layout", o.layoutDir)
	}
	if o.tarPath != "" {
		if err := os.MkdirAll(filepath.Dir(o.tarPath), 0o755); err != nil {
			return err
		}
		if err := tarball.WriteToFile(o.tarPath, tag, images[0]); err != nil {
			return fmt.Errorf("-tarball %s: %w", o.tarPath, err)
		}
		fmt.Printf("mkimage: wrote %s (%s, %s)\n", o.tarPath, tag, o.platforms[0])
	}
	return nil
}

// image is the image of one platform.
func image(o options, goos, arch string, certs []byte) (v1.Image, error) {
	files := map[string][]byte{}
	for _, b := range binaries {
		data, err := os.ReadFile(filepath.Join(o.bin, goos+"_"+arch, b))
		if err != nil {
			return nil, fmt.Errorf("-bin: %w", err)
		}
		files[b] = data
	}
	layerTar, err := rootfs(files, certs, o.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = goos, arch
	cf.Created = v1.Time{Time: o.created}
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", uid, uid),
		Env:        []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		WorkingDir: home,
		Cmd:        []string{"bridge", "--help"},
		ExposedPorts: map[string]struct{}{
			"9464/tcp": {}, // bridge ops port
			"9465/tcp": {}, // consumer ops port
		},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "jsbridge",
			"org.opencontainers.image.description": "Postgres event store -> NATS JetStream -> signed webhooks: the bridge and consumer binaries",
			"org.opencontainers.image.source":      "https://github.com/jsbridge/jsbridge",
			"org.opencontainers.image.version":     o.version,
			"org.opencontainers.image.revision":    o.revision,
		},
	}
	cf.History = []v1.History{{Created: v1.Time{Time: o.created}, CreatedBy: "jsbridge tools/mkimage", Comment: "bridge, consumer, CA certificates, user nonroot"}}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the layer's tar: directories, /etc files and the binaries,
// every entry dated created.
func rootfs(bins map[string][]byte, certs []byte, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(path string, mode int64, owner int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: path + "/", Mode: mode, Uid: owner, Gid: owner, ModTime: created})
	}
	file := func(path string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: mode, Size: int64(len(data)), ModTime: created}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:%s:/sbin/nologin\n", userName, uid, uid, userName, home)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", userName, uid)
	steps := []func() error{
		func() error { return dir("etc", 0o755, 0) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return dir("etc/ssl", 0o755, 0) },
		func() error { return dir("etc/ssl/certs", 0o755, 0) },
		func() error { return file("etc/ssl/certs/ca-certificates.crt", 0o644, certs) },
		func() error { return dir("tmp", 0o1777, 0) },
		func() error { return dir(strings.TrimPrefix(home, "/"), 0o755, uid) },
		func() error { return dir("usr", 0o755, 0) },
		func() error { return dir("usr/local", 0o755, 0) },
		func() error { return dir("usr/local/bin", 0o755, 0) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	for _, b := range binaries {
		if err := file("usr/local/bin/"+b, 0o755, bins[b]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
