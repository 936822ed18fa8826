#include "brigade/data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/philox.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

using testing::TempDir;

std::vector<std::string> pretokens(std::string_view text) {
  std::vector<std::string> out;
  for (const std::string_view piece : split_gpt2_pretokens(text)) out.emplace_back(piece);
  return out;
}

using Strings = std::vector<std::string>;

// Expected splits worked out by hand from GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
TEST(Gpt2PreTokenizer, SplitsLikeGpt2sRegex) {
  EXPECT_EQ(pretokens("Hello world's 123  foo!!"),
            (Strings{"Hello", " world", "'s", " 123", " ", " foo", "!!"}));
  EXPECT_EQ(pretokens("I'm sure we'll've they're"),
            (Strings{"I", "'m", " sure", " we", "'ll", "'ve", " they", "'re"}));
  // Contractions are lower case only; an apostrophe otherwise is punctuation.
  EXPECT_EQ(pretokens("IT'S 'x"), (Strings{"IT", "'", "S", " '", "x"}));
  // A whitespace run gives up its last character to the next word...
  EXPECT_EQ(pretokens("a   b"), (Strings{"a", "  ", " b"}));
  // ...but only a space joins a word; a newline stays alone.
  EXPECT_EQ(pretokens("a\n\nb"), (Strings{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pretokens("a \n b"), (Strings{"a", " \n", " b"}));
  // Trailing whitespace is one piece.
  EXPECT_EQ(pretokens("end.  \n"), (Strings{"end", ".", "  \n"}));
  EXPECT_EQ(pretokens("  lead"), (Strings{" ", " lead"}));
  // Letters, numbers and other characters do not mix.
  EXPECT_EQ(pretokens("abc123def$%^ 4.5"), (Strings{"abc", "123", "def", "$%^", " 4", ".", "5"}));
  EXPECT_TRUE(pretokens("").empty());
}

TEST(Gpt2PreTokenizer, ClassifiesNonAsciiCodePoints) {
  // Letters of several scripts, a Latin-1 superscript digit (\p{N}), a
  // no-break space (\s), an emoji (neither letter nor number).
  EXPECT_EQ(pretokens("caf\xc3\xa9 \xd0\x96\xd0\xb8\xd0\xb2 \xe4\xb8\xad\xe6\x96\x87 x\xc2\xb2"),
            (Strings{"caf\xc3\xa9", " \xd0\x96\xd0\xb8\xd0\xb2", " \xe4\xb8\xad\xe6\x96\x87", " x",
                     "\xc2\xb2"}));
  // Only an ASCII space joins the next word; a no-break space stands alone.
  EXPECT_EQ(pretokens("a\xc2\xa0\xc2\xa0"
                      "b"),
            (Strings{"a", "\xc2\xa0", "\xc2\xa0", "b"}));
  EXPECT_EQ(pretokens("hi \xf0\x9f\x98\x80!"), (Strings{"hi", " \xf0\x9f\x98\x80!"}));
}

TEST(Gpt2PreTokenizer, InvalidUtf8BytesArePunctuationAndNothingIsLost) {
  EXPECT_EQ(pretokens("ab\xff\xfe"
                      "cd \xc3("),
            (Strings{"ab", "\xff\xfe", "cd", " \xc3("}));
  std::string bytes;
  for (uint64_t i = 0; i < 5000; ++i) bytes += static_cast<char>(Philox::below(7, 0, i, 256));
  std::string joined;
  for (const std::string_view piece : split_gpt2_pretokens(bytes)) {
    ASSERT_FALSE(piece.empty());
    joined += piece;
  }
  EXPECT_EQ(joined, bytes);
}

// A GPT-2-format vocabulary small enough to check by hand. "Ġ" (U+0120)
// spells a space; vocab.json escapes it as GPT-2's encoder.json does.
void write_tiny_gpt2_files(const fs::path& dir) {
  write_file_atomic(dir / "vocab.json",
                    R"({"h": 0, "e": 1, "l": 2, "o": 3, "\u0120": 4, "w": 5, "r": 6, "d": 7,)"
                    R"( "!": 8, "he": 9, "ll": 10, "hell": 11, "hello": 12, "\u0120w": 13,)"
                    R"( "or": 14, "Ġwor": 15, "Ġworl": 16, "Ġworld": 17, "el": 18,)"
                    R"( "<|endoftext|>": 19})");
  write_file_atomic(dir / "merges.txt",
                    "#version: 0.2\nh e\nl l\nhe ll\nhell o\n\xc4\xa0 w\no r\n"
                    "\xc4\xa0w or\n\xc4\xa0wor l\n\xc4\xa0worl d\ne l\n");
}

TEST(BpeTokenizer, LoadsGpt2FormatAndEncodesToTheExpectedIds) {
  TempDir dir;
  write_tiny_gpt2_files(dir.path());
  const BpeTokenizer tokenizer = BpeTokenizer::load(dir.path());
  EXPECT_EQ(tokenizer.vocab_size(), 20u);
  EXPECT_EQ(tokenizer.num_merges(), 10u);
  EXPECT_EQ(tokenizer.encode("hello world!"), (std::vector<uint32_t>{12, 17, 8}));
  // "ll" outranks "el", so "ell" is e + ll, not el + l.
  EXPECT_EQ(tokenizer.encode("ell"), (std::vector<uint32_t>{1, 10}));
  EXPECT_EQ(tokenizer.encode("hel"), (std::vector<uint32_t>{9, 2}));
  EXPECT_EQ(tokenizer.encode("wor"), (std::vector<uint32_t>{5, 14}));
  EXPECT_EQ(tokenizer.encode("lol"), (std::vector<uint32_t>{2, 3, 2}));
  EXPECT_EQ(tokenizer.encode("hello hello"), (std::vector<uint32_t>{12, 4, 12}));
  const std::vector<uint32_t> special = {19};
  EXPECT_EQ(tokenizer.decode(special), "<|endoftext|>");
  EXPECT_EQ(tokenizer.token_string(17), "\xc4\xa0world");
  const std::vector<uint32_t> ids = {12, 17, 8};
  EXPECT_EQ(tokenizer.decode(ids), "hello world!");
}

TEST(BpeTokenizer, MissingByteTokenIsAClearError) {
  TempDir dir;
  write_tiny_gpt2_files(dir.path());
  const BpeTokenizer tokenizer = BpeTokenizer::load(dir.path());
  try {
    tokenizer.encode("hello, world");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("0x2c"), std::string::npos) << message;
    EXPECT_NE(message.find("offset 5"), std::string::npos) << message;
  }
  const std::vector<uint32_t> unknown = {20};
  EXPECT_THROW(tokenizer.decode(unknown), Error);
}

TEST(BpeTokenizer, MalformedFilesNameTheFileAndLine) {
  TempDir dir;
  write_tiny_gpt2_files(dir.path());
  write_file_atomic(dir.path() / "merges.txt", "#version: 0.2\nh e\nx y\n");
  try {
    BpeTokenizer::load(dir.path());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("merges.txt:3"), std::string::npos) << message;
    EXPECT_NE(message.find("\"x\""), std::string::npos) << message;
  }
  write_file_atomic(dir.path() / "merges.txt", "h e\nh o\n");
  EXPECT_THROW(BpeTokenizer::load(dir.path()), Error);  // "ho" is not in the vocabulary
  fs::remove(dir.path() / "merges.txt");
  try {
    BpeTokenizer::load(dir.path());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merges.txt"), std::string::npos) << e.what();
  }
  write_file_atomic(dir.path() / "merges.txt", "");
  write_file_atomic(dir.path() / "vocab.json", "{\"a\": 0, \"b\": 0}");
  EXPECT_THROW(BpeTokenizer::load(dir.path()), Error);  // shared id
  write_file_atomic(dir.path() / "vocab.json", "[1, 2]");
  EXPECT_THROW(BpeTokenizer::load(dir.path()), Error);
}

TEST(BpeTokenizer, ByteSymbolsFollowGpt2sBytesToUnicode) {
  const BpeTokenizer tokenizer = BpeTokenizer::train("", 256);
  EXPECT_EQ(tokenizer.vocab_size(), 256u);
  EXPECT_EQ(tokenizer.token_string('a'), "a");
  EXPECT_EQ(tokenizer.token_string(' '), "\xc4\xa0");   // U+0120 Ġ
  EXPECT_EQ(tokenizer.token_string('\n'), "\xc4\x8a");  // U+010A Ċ
  EXPECT_EQ(tokenizer.token_string(0x00), "\xc4\x80");  // U+0100 Ā
  EXPECT_EQ(tokenizer.token_string(0xAD), "\xc5\x83");  // U+0143 Ń
  EXPECT_EQ(tokenizer.token_string(0xC3), "\xc3\x83");  // Ã stands for itself
}

TEST(BpeTokenizer, TrainingMergesTheMostFrequentPairFirst) {
  const BpeTokenizer tokenizer = BpeTokenizer::train("abababab cdcd", 257);
  // The text runs out of pairs long before 100000 tokens.
  EXPECT_LT(BpeTokenizer::train("abababab cdcd", 100000).vocab_size(), 270u);
  ASSERT_EQ(tokenizer.vocab_size(), 257u);
  EXPECT_EQ(tokenizer.token_string(256), "ab");
  // All pairs occur once: the tie goes to the smallest (left, right) ids,
  // here (' ', 'c').
  const BpeTokenizer tied = BpeTokenizer::train("ab cd", 257);
  EXPECT_EQ(tied.token_string(256),
            "\xc4\xa0"
            "c");
}

std::string sample_text() {
  std::string text;
  const char* lines[] = {
      "The quick brown fox jumps over the lazy dog.\n",
      "To be, or not to be: that is the question.\n",
      "It's 2024 and we'll train 12 models; they're small.\n",
      "Caf\xc3\xa9 na\xc3\xafve \xd0\xbc\xd0\xb8\xd1\x80 \xe4\xb8\xad\xe6\x96\x87!\n"};
  for (int i = 0; i < 40; ++i) text += lines[i % 4];
  return text;
}

TEST(BpeTokenizer, TrainedTokenizerRoundTripsArbitraryBytes) {
  const std::string text = sample_text();
  const BpeTokenizer tokenizer = BpeTokenizer::train(text, 330);
  EXPECT_EQ(tokenizer.vocab_size(), 330u);
  const std::vector<uint32_t> tokens = tokenizer.encode(text);
  EXPECT_LT(tokens.size() * 2, text.size());  // merges learned on the text compress it
  EXPECT_EQ(tokenizer.decode(tokens), text);

  std::string bytes = "\xff\xfe\xc3(\xe2\x82 \x80\x80\x00 tail";
  for (uint64_t i = 0; i < 4000; ++i) bytes += static_cast<char>(Philox::below(3, 1, i, 256));
  bytes += text.substr(0, 300);
  const std::vector<uint32_t> byte_tokens = tokenizer.encode(bytes);
  for (const uint32_t id : byte_tokens) ASSERT_LT(id, tokenizer.vocab_size());
  EXPECT_EQ(tokenizer.decode(byte_tokens), bytes);
}

TEST(BpeTokenizer, TrainingIsDeterministic) {
  const std::string text = sample_text();
  const BpeTokenizer a = BpeTokenizer::train(text, 350);
  const BpeTokenizer b = BpeTokenizer::train(text, 350);
  ASSERT_EQ(a.vocab_size(), b.vocab_size());
  for (uint32_t id = 0; id < a.vocab_size(); ++id)
    EXPECT_EQ(a.token_string(id), b.token_string(id));
}

TEST(BpeTokenizer, SaveAndLoadGiveIdenticalEncodings) {
  TempDir dir;
  const std::string text = sample_text();
  BpeTokenizer trained = BpeTokenizer::train(text, 380);
  EXPECT_EQ(trained.spec(), "");
  trained.save(dir.path() / "tok");
  EXPECT_EQ(trained.spec(), fs::absolute(dir.path() / "tok").string());
  const std::string merges = read_file(dir.path() / "tok" / "merges.txt");
  EXPECT_TRUE(merges.starts_with("#version: 0.2\n")) << merges.substr(0, 40);

  const std::unique_ptr<Tokenizer> loaded = load_tokenizer((dir.path() / "tok").string());
  EXPECT_EQ(loaded->vocab_size(), trained.vocab_size());
  EXPECT_EQ(loaded->spec(), trained.spec());
  std::string other = "Unseen words: zebra quixotic 987654 'twas \xff\x01";
  for (const std::string& sample : {text, other}) {
    EXPECT_EQ(loaded->encode(sample), trained.encode(sample));
    EXPECT_EQ(loaded->decode(loaded->encode(sample)), sample);
  }
}

TEST(BpeTokenizer, TrainsOnTinyShakespeare) {
  const fs::path path = fs::path(BRIGADE_SOURCE_DIR) / "data" / "tinyshakespeare.txt";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is not there";
  const std::string text = read_file(path);
  const BpeTokenizer tokenizer = BpeTokenizer::train(text, 2048);
  EXPECT_EQ(tokenizer.vocab_size(), 2048u);
  const std::vector<uint32_t> tokens = tokenizer.encode(text);
  // About 2.9 bytes/token at this size (2.4 at 1024, 3.3 at 5000).
  const double bytes_per_token = static_cast<double>(text.size()) / tokens.size();
  EXPECT_GT(bytes_per_token, 2.7);
  EXPECT_EQ(tokenizer.decode(tokens), text);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
