#!/usr/bin/env bash
# Makes a private CA and one certificate per name, for Nereid's TLS flags (docs/security.md#tls).
#
#   scripts/make_certs.sh DIR NAME [NAME...]
#   scripts/make_certs.sh --cluster DIR [ROLE...]
#
# DIR/ca.pem, DIR/ca.key: the CA (made once; reused when DIR already has one, so more names can
#   be added later). Give ca.pem to clients (--grpc-root-cert / --http-root-cert on servers for
#   mutual TLS; root_certificates / ssl context on clients). Keep ca.key offline.
# DIR/NAME.pem, DIR/NAME.key: a certificate for NAME (a DNS name or an IP address, put in its
#   subjectAltName; "localhost" also gets 127.0.0.1 and ::1), usable as a server certificate
#   (--grpc-server-cert / --http-server-cert) and as a client certificate (mutual TLS).
# --cluster: a cluster CA in DIR (ca.pem: --cluster-tls-ca, ctl's --tls-ca) and one certificate
#   per ROLE (default: control-plane worker router admin) for --cluster-tls-cert/--cluster-tls-key
#   (admin: ctl's --tls-cert/--tls-key), each with the SANs localhost, 127.0.0.1 and ::1 (a
#   loopback cluster) plus SANS (e.g. SANS=DNS:cp-0.cp,IP:10.0.0.5: the names peers dial).
#
# Keys are EC P-256, certificates last DAYS days (default 825; set DAYS=...). Needs openssl.
set -euo pipefail

usage() {
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}
cluster=false
if [ "${1:-}" = "--cluster" ]; then
    cluster=true
    shift
    [ $# -ge 1 ] || usage
else
    [ $# -ge 2 ] || usage
fi
dir=$1
shift
days=${DAYS:-825}
mkdir -p "$dir"
umask 077

if [ ! -f "$dir/ca.pem" ] || [ ! -f "$dir/ca.key" ]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key"
    openssl req -x509 -new -key "$dir/ca.key" -out "$dir/ca.pem" -days "$days" \
        -subj "/CN=Nereid CA" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign"
    echo "made $dir/ca.pem" >&2
fi

# leaf FILE CN SAN: DIR/FILE.pem and DIR/FILE.key for CN, signed by the CA.
leaf() {
    local file=$1 cn=$2 san=$3 ext csr
    ext=$(mktemp)
    csr=$(mktemp)
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" > "$ext"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$file.key"
    openssl req -new -key "$dir/$file.key" -out "$csr" -subj "/CN=$cn"
    openssl x509 -req -in "$csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -out "$dir/$file.pem" -days "$days" -extfile "$ext" 2>/dev/null
    rm -f "$ext" "$csr"
    echo "made $dir/$file.pem ($san)" >&2
}

if $cluster; then
    [ $# -ge 1 ] || set -- control-plane worker router admin
    for role in "$@"; do
        case "$role" in
            */* | "" | *[!A-Za-z0-9._-]* ) echo "bad role '$role': use letters, digits, . _ -" >&2; exit 2 ;;
        esac
        leaf "$role" "nereid-$role" "DNS:localhost,IP:127.0.0.1,IP:::1${SANS:+,$SANS}"
    done
else
    for name in "$@"; do
        case "$name" in
            */* | "" ) echo "bad name '$name': use a DNS name or an IP address" >&2; exit 2 ;;
        esac
        if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
            san="IP:$name"
        elif [ "$name" = localhost ]; then
            san="DNS:localhost,IP:127.0.0.1,IP:::1"
        else
            san="DNS:$name"
        fi
        leaf "${name//:/_}" "$name" "$san"
    done
fi
chmod 644 "$dir"/*.pem
