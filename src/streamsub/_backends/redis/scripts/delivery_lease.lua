-- Set the lease of deliveries named by their ack ids (the Pub/Sub gateway's
-- ModifyAckDeadline and lease keeping): the entry's idle time decides when
-- reclaimers with min-idle M take it (M - idle ms from now). Owner- and
-- count-checked like delivery_ack.lua; the delivery count is not changed.
-- KEYS[1]: the stream. ARGV: group, M, then for each delivery: id, consumer,
-- delivery count, idle ms, mode. Modes:
--   set     the idle time becomes the given one (a client's ModifyAckDeadline);
--   extend  idle 0, only while the lease still runs (idle < M): a lease that
--           ended, or was given back meanwhile by another gateway, stays ended;
--   end     the idle time becomes the given one unless it is already larger:
--           fixing when a lease ends never brings back one given back.
-- Returns the ids whose lease was set.
local key, group, min_idle = KEYS[1], ARGV[1], tonumber(ARGV[2])
local set = {}
for i = 3, #ARGV, 5 do
  local id, consumer = ARGV[i], ARGV[i + 1]
  local wanted, mode = tonumber(ARGV[i + 3]), ARGV[i + 4]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if pending[1] and pending[1][2] == consumer and pending[1][4] == tonumber(ARGV[i + 2]) then
    local idle = pending[1][3]
    local apply = true
    if mode == 'extend' then
      apply = idle < min_idle
      wanted = 0
    elseif mode == 'end' then
      wanted = math.max(idle, wanted)
    end
    if apply then
      redis.call('XCLAIM', key, group, consumer, 0, id, 'IDLE', wanted, 'JUSTID')
      set[#set + 1] = id
    end
  end
end
return set
