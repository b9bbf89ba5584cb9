-- Set one field of a record hash only if the record exists: the check and the
-- write are one step, so a write racing the record's deletion cannot recreate
-- a record that holds only that field.
-- KEYS[1]: the record. ARGV[1]: field, ARGV[2]: value.
-- Returns 1 when set, 0 when there is no such record.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
