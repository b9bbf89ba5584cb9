-- Appending a dead letter, prepended to the scripts that do it: ``blob`` is the
-- message packed as append.lua takes it (a 2-byte count, then per field a
-- 4-byte length and the bytes; or a count of 0, a 4-byte message count of 1
-- and the data alone, a message without key or attributes), appended with its
-- first and last delivery times as attributes.
-- ``wake``, when given and not '', is the target partition's wake-up channel,
-- SPUBLISHed to after the append (as append.lua does; Redis Cluster 7.0+ only).
local function append_dead_letter(target, blob, first, last, wake)
  local n, pos = struct.unpack('>I2', blob, 1)
  local args = {'XADD', target, '*'}
  if n == 0 then  -- a run of data alone: its one message's data
    local run
    run, pos = struct.unpack('>I4', blob, pos)
    -- Before any write: a run of another length aborts the script whole.
    assert(run == 1, 'a dead letter is one message, not a run of ' .. run)
    args[4] = 'd'
    n = 1
  end
  for _ = 1, n do
    local len
    len, pos = struct.unpack('>I4', blob, pos)
    args[#args + 1] = string.sub(blob, pos, pos + len - 1)
    pos = pos + len
  end
  args[#args + 1] = 'a:streamsub.first_delivery_ms'
  args[#args + 1] = first
  args[#args + 1] = 'a:streamsub.last_delivery_ms'
  args[#args + 1] = last
  local id = redis.call(unpack(args))
  if wake and wake ~= '' then
    redis.pcall('SPUBLISH', wake, '')
  end
  return id
end
