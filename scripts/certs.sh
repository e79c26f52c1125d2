# Sourced by the scripts that run secured test servers (kafka.sh,
# redis.sh): a CA and a server certificate for 127.0.0.1 and localhost,
# made at start and never kept in the repository.
#   make_server_cert DIR NAME   writes DIR/ca.crt, DIR/ca.key, DIR/NAME.crt, DIR/NAME.key
make_server_cert() {
  local dir=$1 name=$2
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=surge test CA ($name)" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$dir/san.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 30 -extfile "$dir/san.ext" -out "$dir/$name.crt" 2>/dev/null
}
