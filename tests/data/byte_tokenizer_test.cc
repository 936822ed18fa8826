#include "brigade/data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include <string>

#include "brigade/core/error.h"
#include "brigade/data/tokenizer.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

std::string all_bytes() {
  std::string text;
  for (int b = 0; b < 256; ++b) text += static_cast<char>(b);
  return text;
}

TEST(ByteTokenizer, TokenIsTheByteValue) {
  const ByteTokenizer tokenizer;
  EXPECT_EQ(tokenizer.vocab_size(), 256u);
  EXPECT_EQ(tokenizer.spec(), "byte");
  EXPECT_EQ(tokenizer.encode("Az\n"), (std::vector<uint32_t>{65, 122, 10}));
  EXPECT_TRUE(tokenizer.encode("").empty());
}

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const ByteTokenizer tokenizer;
  const std::string text = all_bytes() + "\xff\xfe invalid \xc3( utf-8" + std::string(3, '\0');
  const std::vector<uint32_t> tokens = tokenizer.encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(tokens[i], static_cast<unsigned char>(text[i]));
  }
  EXPECT_EQ(tokenizer.decode(tokens), text);
}

TEST(ByteTokenizer, SmallVocabularyRejectsHighBytesWithOffset) {
  const ByteTokenizer tokenizer(128);
  EXPECT_EQ(tokenizer.encode("plain ascii").size(), 11u);
  try {
    tokenizer.encode("caf\xc3\xa9!");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("0xc3"), std::string::npos) << message;
    EXPECT_NE(message.find("offset 3"), std::string::npos) << message;
    EXPECT_NE(message.find("128"), std::string::npos) << message;
  }
}

TEST(ByteTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const ByteTokenizer tokenizer(100);
  const std::vector<uint32_t> tokens = {1, 2, 100};
  EXPECT_THROW(tokenizer.decode(tokens), Error);
  EXPECT_THROW(ByteTokenizer(0), Error);
  EXPECT_THROW(ByteTokenizer(257), Error);
}

TEST(LoadTokenizer, ByteSpecGivesTheByteTokenizer) {
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer("byte");
  EXPECT_EQ(tokenizer->vocab_size(), 256u);
  EXPECT_EQ(tokenizer->spec(), "byte");
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("round trip")), "round trip");
}

TEST(LoadTokenizer, MissingDirectoryNamesThePathAndWhatIsExpected) {
  try {
    load_tokenizer("/nonexistent/brigade-tokenizer");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("/nonexistent/brigade-tokenizer"), std::string::npos) << message;
    EXPECT_NE(message.find("vocab.json"), std::string::npos) << message;
    EXPECT_NE(message.find("merges.txt"), std::string::npos) << message;
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
