# Sourced by the supervise tests: field FILE NAME prints a number or string field of a one-line
# JSON heartbeat (src/supervise/heartbeat.h), or "" if the file or the field is absent.
field() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" "$1" 2>/dev/null || true; }
