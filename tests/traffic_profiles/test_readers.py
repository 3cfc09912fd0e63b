import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traffic_profiles import Trace, TraceError, read_trace, write_parquet


def test_azure_csv_and_canonical_parquet_agree(conv_trace, examples):
    assert conv_trace.format == "azure" and conv_trace.rows == 19366
    assert conv_trace.start_time.startswith("2023-11-16T18:15:46")
    assert abs(conv_trace.duration_s - 3501.72) < 0.01
    pq_trace = read_trace(examples / "azure2023_conv.parquet")
    assert pq_trace.format == "canonical"
    np.testing.assert_allclose(pq_trace.timestamp_s, conv_trace.timestamp_s)
    np.testing.assert_array_equal(pq_trace.input_tokens, conv_trace.input_tokens)
    np.testing.assert_array_equal(pq_trace.output_tokens, conv_trace.output_tokens)


def test_mooncake_jsonl_hashes(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
            {"timestamp": 2500, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 1000, "input_length": 600, "output_length": 7, "hash_ids": [9, 10]}]
    p = tmp_path / "mc.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = read_trace(p)
    assert t.format == "mooncake" and t.block_size == 512
    np.testing.assert_allclose(t.timestamp_s, [0.0, 1.0, 2.5])         # ms -> s, sorted
    assert t.input_tokens.tolist() == [1000, 600, 1500]
    assert t.hash_ids(2).tolist() == [1, 2, 3] and t.hash_ids(1).tolist() == [9, 10]


def test_burstgpt_csv(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n12,GPT-4,1200,0,1200,API log\n")
    t = read_trace(p)
    assert t.format == "burstgpt" and t.timestamp_s.tolist() == [0.0, 7.0]
    assert t.model.tolist() == ["ChatGPT", "GPT-4"] and t.output_tokens.tolist() == [18, 0]


def test_canonical_roundtrip_all_columns(tmp_path):
    t = Trace(timestamp_s=np.array([0.0, 1.0, 2.0]), input_tokens=np.array([10, 20, 30]),
              output_tokens=np.array([1, 2, 3]), cached_tokens=np.array([0, 16, 16]),
              session_id=np.array([0, 0, -1]), hash_offsets=np.array([0, 1, 2, 4]),
              hash_values=np.array([7, 7, 7, 8]), block_size=16,
              model=np.array(["a", "b", "a"], dtype=object), region=np.array(["eu", "us", "eu"], dtype=object))
    back = read_trace(write_parquet(t, tmp_path / "t.parquet"))
    assert back.block_size == 16 and back.cached_tokens.tolist() == [0, 16, 16]
    assert back.session_id.tolist() == [0, 0, -1] and back.hash_ids(2).tolist() == [7, 8]
    assert back.region.tolist() == ["eu", "us", "eu"]
    csv = tmp_path / "t.csv"     # the same columns as CSV, hash_ids as JSON lists
    csv.write_text('timestamp,input_tokens,output_tokens,hash_ids\n0.5,10,1,"[1, 2]"\n0.0,20,2,[]\n')
    c = read_trace(csv, block_size=8)
    assert c.input_tokens.tolist() == [20, 10] and c.hash_ids(1).tolist() == [1, 2] and c.block_size == 8


BAD = {
    "missing.csv": ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "missing column 'GeneratedTokens'"),
    "negative.csv": ("timestamp,input_tokens,output_tokens\n0,5,1\n1,-3,2\n", "row 2 (line 3): input_tokens is negative"),
    "fraction.csv": ("timestamp,input_tokens,output_tokens\n0,5,1.5\n", "row 1 (line 2): output_tokens is not an integer"),
    "text.csv": ("timestamp,input_tokens,output_tokens\n0,5,1\n1,abc,1\n", "row 2 (line 3): input_tokens is not a number"),
    "time.csv": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\nyesterday,3,4\n",
                 "row 2 (line 3): unparsable timestamp 'yesterday'"),
    "empty.csv": ("", "empty file"),
    "header_only.csv": ("timestamp,input_tokens,output_tokens\n", "empty trace"),
    "prose.txt": ("Dear diary,\ntoday I served many requests.\n", "not a trace"),
    "cached.csv": ("timestamp,input_tokens,output_tokens,cached_tokens\n0,5,1,9\n", "cached_tokens 9 exceeds"),
    "broken.jsonl": ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": \n',
                     "row 2 (line 2): invalid JSON"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_files_name_file_row_and_problem(tmp_path, name):
    content, expected = BAD[name]
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(TraceError) as e:
        read_trace(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and expected in msg and "\n" not in msg


def test_binary_and_corrupt_parquet(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"\x00\x01\x02garbage")
    with pytest.raises(TraceError, match="not a trace"):
        read_trace(p)
    q = tmp_path / "x.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), q)
    with pytest.raises(TraceError, match="not a trace"):
        read_trace(q)
    q.write_bytes(b"PAR1" + b"\x00" * 20)
    with pytest.raises(TraceError, match="unreadable parquet"):
        read_trace(q)
