# Port helpers shared by the bench scripts (sourced, not run).

# `true` when something accepts connections on 127.0.0.1:$1.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Prints a random port in 20000-59999 that nothing listens on now.
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    listening "$port" || { echo "$port"; return; }
  done
}
