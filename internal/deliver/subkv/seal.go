package subkv

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Sealing: a subscription's signing secrets, header values and full URL
// never sit in the bucket in clear (anyone who can read the NATS account
// could forge webhooks). They are sealed with AES-256-GCM (crypto/cipher)
// under a key the consumer is given, with the subscription's name as
// additional data (a sealed blob copied to another subscription does not
// open), and the key's id stored beside the ciphertext so that keys can
// rotate: a Keyring seals with its first key and opens with any.

// ErrInvalidKey is wrapped by ParseKeyring for a key it cannot read.
var ErrInvalidKey = errors.New("invalid secrets key")

// ErrUnknownKey is wrapped by Open when a document was sealed with a key
// id the keyring does not hold: give this replica that key too (old keys
// stay in the keyring, after the current one, until every document was
// resealed).
var ErrUnknownKey = errors.New("sealed with a key this keyring does not hold")

// ErrNoKey is wrapped by writes when the store has no keyring: secrets
// cannot be sealed.
var ErrNoKey = errors.New("no secrets key given")

var validKeyID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// keySize is the size of a secrets key in bytes (AES-256).
const keySize = 32

// Keyring holds the keys that seal and open subscriptions' secrets: the
// first seals, every one opens.
type Keyring struct {
	ids  []string
	aead map[string]cipher.AEAD
}

// ParseKeyring reads keys written one per line (or separated by commas),
// each "<id>:<base64 of 32 bytes>"; blank lines and lines starting with
// "#" are skipped. The first key seals; the others only open (keys kept
// during a rotation). An error wraps ErrInvalidKey and names the entry by
// its position and id, never the key.
func ParseKeyring(text string) (*Keyring, error) {
	k := &Keyring{aead: map[string]cipher.AEAD{}}
	n := 0
	for _, line := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ',' }) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n++
		id, enc, ok := strings.Cut(line, ":")
		id = strings.TrimSpace(id)
		if !ok || !validKeyID.MatchString(id) {
			return nil, fmt.Errorf("%w: entry %d: want <id>:<base64 key> with id [A-Za-z0-9_-]+", ErrInvalidKey, n)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if err != nil || len(raw) != keySize {
			return nil, fmt.Errorf("%w: entry %d (id %q): want %d bytes in standard base64", ErrInvalidKey, n, id, keySize)
		}
		if _, dup := k.aead[id]; dup {
			return nil, fmt.Errorf("%w: entry %d: id %q given twice", ErrInvalidKey, n, id)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d (id %q): %v", ErrInvalidKey, n, id, err)
		}
		gcm, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d (id %q): %v", ErrInvalidKey, n, id, err)
		}
		k.ids = append(k.ids, id)
		k.aead[id] = gcm
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: no key given (want <id>:<base64 key>; make one with `consumer subscriptions keygen`)", ErrInvalidKey)
	}
	return k, nil
}

// GenerateKey returns a new keyring line "<id>:<base64 of 32 random
// bytes>" for ParseKeyring.
func GenerateKey(id string) (string, error) {
	if !validKeyID.MatchString(id) {
		return "", fmt.Errorf("%w: id %q does not match [A-Za-z0-9_-]{1,64}", ErrInvalidKey, id)
	}
	b := make([]byte, keySize)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return id + ":" + base64.StdEncoding.EncodeToString(b), nil
}

// Current returns the id of the key that seals.
func (k *Keyring) Current() string { return k.ids[0] }

// Sealed is a sealed blob as the document stores it.
type Sealed struct {
	// KeyID names the key that sealed Data.
	KeyID string `json:"key_id"`
	// Data is base64 of the 12-byte GCM nonce followed by the ciphertext
	// and tag.
	Data string `json:"data"`
}

// aad binds a sealed blob to its subscription's name.
func aad(name string) []byte { return []byte("jsbridge subscription v1 " + name) }

// seal seals plaintext for subscription name with the current key.
func (k *Keyring) seal(name string, plaintext []byte) (Sealed, error) {
	id := k.Current()
	gcm := k.aead[id]
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return Sealed{}, err
	}
	out := gcm.Seal(nonce, nonce, plaintext, aad(name))
	return Sealed{KeyID: id, Data: base64.StdEncoding.EncodeToString(out)}, nil
}

// open opens s, sealed for subscription name.
func (k *Keyring) open(name string, s Sealed) ([]byte, error) {
	gcm, ok := k.aead[s.KeyID]
	if !ok {
		return nil, fmt.Errorf("%w: key id %q (this keyring holds %s)", ErrUnknownKey, s.KeyID, strings.Join(k.ids, ", "))
	}
	raw, err := base64.StdEncoding.DecodeString(s.Data)
	if err != nil || len(raw) < gcm.NonceSize() {
		return nil, fmt.Errorf("sealed data of key id %q is not base64 of a nonce and ciphertext", s.KeyID)
	}
	plain, err := gcm.Open(nil, raw[:gcm.NonceSize()], raw[gcm.NonceSize():], aad(name))
	if err != nil {
		return nil, fmt.Errorf("sealed data does not open with key id %q (another key with that id, or it was sealed for another subscription)", s.KeyID)
	}
	return plain, nil
}
