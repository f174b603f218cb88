#!/usr/bin/env bash
# A throwaway certificate authority and one certificate it signed, for local clusters and tests
# (production certificates come from your own CA; docs/security.md, "TLS on the gRPC listeners").
#   ./deploy/make-tls-certs.sh DIR [SAN]
# writes DIR/ca.pem, DIR/ca.key, DIR/cert.pem, DIR/cert.key (keys mode 0600, DIR mode 0700).
# SAN (default "IP:127.0.0.1,DNS:localhost") must name every address peers dial: the certificate
# serves mc-master and the mc-clients' Store listeners, and is their client certificate too.
# Existing files are kept (a restarted cluster keeps its CA); delete DIR for new ones.
# Valid for MC_TLS_DAYS days (default 30).
set -euo pipefail
dir="${1:?usage: $0 DIR [SAN]}"
san="${2:-IP:127.0.0.1,DNS:localhost}"
days="${MC_TLS_DAYS:-30}"
if [[ -s "$dir/ca.pem" && -s "$dir/cert.pem" && -s "$dir/cert.key" ]]; then exit 0; fi
command -v openssl >/dev/null || { echo "make-tls-certs: openssl missing (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
chmod 700 "$dir"
umask 077
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" \
  -subj "/CN=mcstore throwaway CA" 2>/dev/null
openssl req "${ec[@]}" -keyout "$dir/cert.key" -out "$dir/cert.csr" -subj "/CN=mcstore" 2>/dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' \
  "$san" >"$dir/cert.ext"
openssl x509 -req -in "$dir/cert.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
  -out "$dir/cert.pem" -days "$days" -extfile "$dir/cert.ext" 2>/dev/null
rm -f "$dir/cert.csr" "$dir/cert.ext" "$dir/ca.srl"
chmod 600 "$dir/ca.key" "$dir/cert.key"
chmod 644 "$dir/ca.pem" "$dir/cert.pem"
