-- Every script starts here. A step sent into a slot being imported, naming a
-- key that exists on neither node (a delay set before any delayed nack), is
-- answered TRYAGAIN while it declares that key, so the router sends it again
-- declaring only the keys that exist (_routing.SlotRouter), with ARGV: the
-- marker, the number of keys n, all n keys in order, then the step's own
-- ARGV. KEYS and ARGV are shadowed by locals rebuilt from that (Redis 7 keeps
-- globals read-only); a step sent the usual way finds them as they came.
local KEYS, ARGV = KEYS, ARGV
if ARGV[1] == '\0streamsub-undeclared-keys\0' then
  local n, keys, args = tonumber(ARGV[2]), {}, {}
  for i = 1, n do keys[i] = ARGV[2 + i] end
  for i = n + 3, #ARGV do args[#args + 1] = ARGV[i] end
  KEYS, ARGV = keys, args
end
