#!/bin/sh
# The `keys` service of deploy/compose.yaml: make the federation's keys once (`fedshard keys init`)
# and hand each container only what it needs, in its own volume:
#   ca                 the CA (ca.key never leaves this volume)
#   keys-aggregator    SuperLink, coordinator, zone certificates, sites' public keys, public HE context
#   keys-zone-<zone>   the zone's certificate and key, the CA certificate, sites' public keys, public context
#   keys-<site>        the site's bundle, and nothing else
set -eu
if [ -e /out/ca/ca.pem ]; then
  echo "keys: the federation's keys exist (volume ca); nothing written"
  exit 0
fi
made=$(mktemp -d)
fedshard keys init --config /config/federation.yaml --out "$made"
cp -a "$made/ca/." /out/ca/
cp -a "$made/aggregator/." /out/aggregator/
for cert in "$made"/aggregator/zones/*.pem; do
  zone=$(basename "$cert" .pem)
  out=/out/zone-$zone
  mkdir -p "$out/zones"
  cp -a "$made/aggregator/ca.pem" "$made/aggregator/site-keys" "$out/"
  cp -a "$made/aggregator/zones/$zone.pem" "$made/aggregator/zones/$zone.key" "$out/zones/"
  if [ -d "$made/aggregator/he" ]; then cp -a "$made/aggregator/he" "$out/"; fi
done
for bundle in "$made"/sites/*/; do
  site=$(basename "$bundle")
  cp -a "$bundle." "/out/site-$site/"
done
rm -rf "$made"
chown -R 10001:10001 /out/aggregator /out/zone-* /out/site-*   # the image's user; the CA stays root's
echo "keys: made and handed out (each site's volume holds only its own bundle)"
