-- A transfer's throughput over time, from the client's trace (`haul cp --trace`) when one was
-- recorded: `seconds:bits_per_second` pairs separated by spaces, at most 600.
ALTER TABLE transfers ADD COLUMN trace TEXT NOT NULL DEFAULT '';
