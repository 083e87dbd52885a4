"""The names of CodefyUI's 110 built-in node types (version 1.4.2).

Used to tell a user whose graph names a type cdui lacks whether it is one of
CodefyUI's own built-ins (then this cdui version lacks it), a plugin node
(``pack:Type``), or a custom node of their own.
"""
from __future__ import annotations

CODEFYUI_BUILTINS: frozenset[str] = frozenset({
    "Accuracy", "Activation", "AdaptiveAvgPool2d", "Add", "Argmax", "AttentionHeatmap",
    "AttentionMask", "AvgPool2d", "BackwardOnce", "BatchNorm1d", "BatchNorm2d", "CSVReader",
    "CheckpointLoader", "CheckpointSaver", "ColumnSelector", "Concat", "Conv1d", "Conv2d",
    "Conv2dExplicit", "Conv2dKernel", "ConvTranspose2d", "CosineSimilarity", "DDPMSampler", "DQN",
    "DataLoader", "Dataset", "DatasetBatch", "DecisionBoundary", "DecisionTreeClassifier",
    "DiffusionTrainingLoop", "DiffusionUNet", "Dropout", "Embedding", "EmbeddingScatter",
    "EnvWrapper", "EvaluateModel", "FileReader", "Flatten", "GRU", "GaussianNoise", "GraphInput",
    "GraphOutput", "GroupNorm", "HuggingFaceDataset", "ImageBatchReader", "ImageReader",
    "ImageWriter", "Inference", "InstanceNorm2d", "KLDivergence", "KNN", "KaggleDataset",
    "LLMChat", "LRScheduler", "LSTM", "LayerNorm", "Lerp", "Linear", "LinearRegression",
    "LogisticRegression", "Loss", "MLPClassifier", "Map", "MatMul", "MaxPool2d", "Mean",
    "MoELayer", "ModelLoader", "ModelSaver", "MultiHeadAttention", "Multiply", "Normalize",
    "Optimizer", "PPO", "Permute", "PositionalEncoding", "Print", "RNNCell",
    "RandomForestClassifier", "Reduce", "Reshape", "RewardModel", "RowSelector", "SVMClassifier",
    "ScalarMultiply", "ScatterPlot2D", "SequentialModel", "Softmax", "Split", "Squeeze", "Stack",
    "Start", "Switch", "SyntheticDataset", "SyntheticSegmentation", "SyntheticShapes",
    "TensorCreate", "TensorInput", "TextInput", "TimestepEmbedding", "Tokenizer", "TrainTestSplit",
    "TrainingLoop", "Transform", "TransformerDecoder", "TransformerEncoder", "Unsqueeze",
    "Upsample", "Visualize", "WordVector",
})
