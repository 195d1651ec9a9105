enable f16;@group(0)
@binding(0)
var<storage, read_write> buffer_0_global: array<vec4<f16>>;

@group(0)
@binding(1)
var<storage, read_write> buffer_1_global: array<u32>;

@group(0)
@binding(2)
var<storage, read_write> buffer_2_global: array<f32>;

@group(0)
@binding(3)
var<storage, read_write> buffer_3_global: array<vec4<f32>>;

@group(0)
@binding(4)
var<storage, read_write> buffer_4_global: array<f32>;

struct info_st {
   scalars_f32: array<f32, 2>,
   scalars_u32: array<u32, 8>,
   static_meta: array<u32, 10>,
}

@group(0)
@binding(5)
var<storage, read> info: info_st;

var<workgroup> shared_memory_10: array<f32, 512>;

var<workgroup> shared_memory_11: array<f32, 512>;

var<workgroup> shared_memory_12: array<f32, 64>;

var<workgroup> shared_memory_13: array<f32, 1>;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn quantize_rows_e__n_4(
    @builtin(local_invocation_index) local_idx: u32,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
var l_mut_145: u32;
var l_mut_150: u32;
var l_mut_154: u32;
var l_mut_18: f32;
var l_mut_19: f32;
var l_mut_232: u32;
var l_mut_30: vec4<f32>;
let l_0 = local_idx % u32(8);
let l_1 = local_idx / u32(8);
let l_2 = workgroup_id.x * u32(64);
let l_3 = workgroup_id.z * info.scalars_u32[3];
let l_4 = workgroup_id.y * info.scalars_u32[4];
let l_5 = l_3 + l_4;
let l_6 = workgroup_id.z * info.scalars_u32[7];
let l_7 = workgroup_id.y / info.scalars_u32[6];
let l_8 = l_6 + l_7;
let l_9 = l_8 * u32(16);

for (var l_mut_14: u32 = u32(0); l_mut_14 < u32(4); l_mut_14++) {
let l_15 = l_mut_14 * u32(16);
let l_16 = l_15 + l_1;
let l_17 = l_2 + l_16;
l_mut_18 = f32(0.0);
l_mut_19 = f32(0.0);
let l_20 = l_16 < u32(64);
let l_21 = l_17 < info.scalars_u32[0];
let l_22 = l_20 && l_21;
if l_22 {
let l_23 = l_17 * info.scalars_u32[5];
let l_24 = l_5 + l_23;

for (var l_mut_25: u32 = l_0; l_mut_25 < u32(16); l_mut_25 += u32(8)) {
let l_26 = l_24 / u32(4);
let l_27 = l_26 + l_mut_25;
let l_28 = buffer_0_global[l_27];
let l_29 = vec4<f32>(l_28);
l_mut_30 = l_29;
let l_31 = l_mut_30[u32(0)];
let l_32 = abs(l_31);
let l_33 = max(l_mut_18, l_32);
l_mut_18 = l_33;
let l_34 = l_mut_30[u32(1)];
let l_35 = abs(l_34);
let l_36 = max(l_mut_18, l_35);
l_mut_18 = l_36;
let l_37 = l_mut_30[u32(2)];
let l_38 = abs(l_37);
let l_39 = max(l_mut_18, l_38);
l_mut_18 = l_39;
let l_40 = l_mut_30[u32(3)];
let l_41 = abs(l_40);
let l_42 = max(l_mut_18, l_41);
l_mut_18 = l_42;
let l_43 = l_9 + l_mut_25;
let l_44 = buffer_3_global[l_43];
let l_45 = l_mut_30[u32(0)];
let l_46 = l_44[u32(0)];
let l_47 = l_45 * l_46;
l_mut_19 = l_mut_19 + l_47;
let l_48 = l_mut_30[u32(1)];
let l_49 = l_44[u32(1)];
let l_50 = l_48 * l_49;
l_mut_19 = l_mut_19 + l_50;
let l_51 = l_mut_30[u32(2)];
let l_52 = l_44[u32(2)];
let l_53 = l_51 * l_52;
l_mut_19 = l_mut_19 + l_53;
let l_54 = l_mut_30[u32(3)];
let l_55 = l_44[u32(3)];
let l_56 = l_54 * l_55;
l_mut_19 = l_mut_19 + l_56;
}
}
let l_57 = l_16 * u32(8);
let l_58 = l_57 + l_0;
shared_memory_10[l_58] = l_mut_18;
let l_59 = l_16 * u32(8);
let l_60 = l_59 + l_0;
shared_memory_11[l_60] = l_mut_19;
}
workgroupBarrier();

for (var l_mut_61: u32 = local_idx; l_mut_61 < u32(64); l_mut_61 += u32(128)) {
l_mut_19 = f32(0.0);
let l_62 = l_mut_61 * u32(8);
let l_63 = l_62 + u32(0);
let l_64 = shared_memory_10[l_63];
let l_65 = max(l_mut_19, l_64);
l_mut_19 = l_65;
let l_66 = l_mut_61 * u32(8);
let l_67 = l_66 + u32(1);
let l_68 = shared_memory_10[l_67];
let l_69 = max(l_mut_19, l_68);
l_mut_19 = l_69;
let l_70 = l_mut_61 * u32(8);
let l_71 = l_70 + u32(2);
let l_72 = shared_memory_10[l_71];
let l_73 = max(l_mut_19, l_72);
l_mut_19 = l_73;
let l_74 = l_mut_61 * u32(8);
let l_75 = l_74 + u32(3);
let l_76 = shared_memory_10[l_75];
let l_77 = max(l_mut_19, l_76);
l_mut_19 = l_77;
let l_78 = l_mut_61 * u32(8);
let l_79 = l_78 + u32(4);
let l_80 = shared_memory_10[l_79];
let l_81 = max(l_mut_19, l_80);
l_mut_19 = l_81;
let l_82 = l_mut_61 * u32(8);
let l_83 = l_82 + u32(5);
let l_84 = shared_memory_10[l_83];
let l_85 = max(l_mut_19, l_84);
l_mut_19 = l_85;
let l_86 = l_mut_61 * u32(8);
let l_87 = l_86 + u32(6);
let l_88 = shared_memory_10[l_87];
let l_89 = max(l_mut_19, l_88);
l_mut_19 = l_89;
let l_90 = l_mut_61 * u32(8);
let l_91 = l_90 + u32(7);
let l_92 = shared_memory_10[l_91];
let l_93 = max(l_mut_19, l_92);
l_mut_19 = l_93;
shared_memory_12[l_mut_61] = l_mut_19;
let l_94 = l_2 + l_mut_61;
let l_95 = l_94 < info.scalars_u32[0];
if l_95 {
let l_96 = l_mut_61 * u32(8);
let l_97 = shared_memory_11[l_96];
l_mut_19 = l_97;
let l_98 = l_mut_61 * u32(8);
let l_99 = l_98 + u32(1);
let l_100 = shared_memory_11[l_99];
l_mut_19 = l_mut_19 + l_100;
let l_101 = l_mut_61 * u32(8);
let l_102 = l_101 + u32(2);
let l_103 = shared_memory_11[l_102];
l_mut_19 = l_mut_19 + l_103;
let l_104 = l_mut_61 * u32(8);
let l_105 = l_104 + u32(3);
let l_106 = shared_memory_11[l_105];
l_mut_19 = l_mut_19 + l_106;
let l_107 = l_mut_61 * u32(8);
let l_108 = l_107 + u32(4);
let l_109 = shared_memory_11[l_108];
l_mut_19 = l_mut_19 + l_109;
let l_110 = l_mut_61 * u32(8);
let l_111 = l_110 + u32(5);
let l_112 = shared_memory_11[l_111];
l_mut_19 = l_mut_19 + l_112;
let l_113 = l_mut_61 * u32(8);
let l_114 = l_113 + u32(6);
let l_115 = shared_memory_11[l_114];
l_mut_19 = l_mut_19 + l_115;
let l_116 = l_mut_61 * u32(8);
let l_117 = l_116 + u32(7);
let l_118 = shared_memory_11[l_117];
l_mut_19 = l_mut_19 + l_118;
let l_119 = workgroup_id.z * info.scalars_u32[1];
let l_120 = l_119 + workgroup_id.y;
let l_121 = l_120 * info.scalars_u32[0];
let l_122 = l_121 + l_94;
let l_123 = l_mut_19 * info.scalars_f32[1];
buffer_4_global[l_122] = l_123;
}
}
workgroupBarrier();

for (var l_mut_124: u32 = local_idx; l_mut_124 < u32(1); l_mut_124 += u32(128)) {
l_mut_19 = f32(0.0);
let l_125 = l_mut_124 * u32(64);
let l_126 = l_mut_124 * u32(64);
let l_127 = l_126 + u32(64);

for (var l_mut_128: u32 = l_125; l_mut_128 < l_127; l_mut_128++) {
let l_129 = shared_memory_12[l_mut_128];
let l_130 = max(l_mut_19, l_129);
l_mut_19 = l_130;
}
let l_131 = l_mut_19 > f32(0.0);
let l_132 = bitcast<u32>(l_mut_19);
let l_133 = l_132 & u32(2147483648);
let l_134 = l_132 >> u32(23);
let l_135 = l_134 & u32(255);
let l_136 = u32(1123942400) >> u32(23);
let l_137 = l_136 & u32(255);
let l_138 = l_132 & u32(8388607);
let l_139 = l_138 | u32(8388608);
let l_140 = u32(1123942400) & u32(8388607);
let l_141 = l_140 | u32(8388608);
let l_142 = l_139 < l_141;
let l_143 = select(u32(0), u32(1), l_142);
let l_144 = l_139 << l_143;
l_mut_145 = l_144;
let l_146 = l_135 + u32(127);
let l_147 = l_146 + u32(256);
let l_148 = l_147 - l_137;
let l_149 = l_148 - l_143;
l_mut_150 = u32(0);

for (var l_mut_151: u32 = u32(0); l_mut_151 < u32(25); l_mut_151++) {
l_mut_150 = l_mut_150 << u32(1);
let l_152 = l_mut_145 >= l_141;
if l_152 {
l_mut_145 = l_mut_145 - l_141;
l_mut_150 = l_mut_150 | u32(1);
}
l_mut_145 = l_mut_145 << u32(1);
}
let l_153 = l_mut_150 >> u32(1);
l_mut_154 = l_153;
let l_155 = l_mut_150 & u32(1);
let l_156 = l_155 == u32(1);
let l_157 = l_mut_145 != u32(0);
let l_158 = l_mut_154 & u32(1);
let l_159 = l_158 == u32(1);
let l_160 = l_157 || l_159;
let l_161 = l_156 && l_160;
let l_162 = select(u32(0), u32(1), l_161);
l_mut_154 = l_mut_154 + l_162;
let l_163 = l_mut_154 >> u32(24);
l_mut_154 = l_mut_154 >> l_163;
let l_164 = l_149 + l_163;
let l_165 = l_135 != u32(0);
let l_166 = l_164 >= u32(257);
let l_167 = l_165 && l_166;
let l_168 = l_164 <= u32(510);
let l_169 = l_167 && l_168;
let l_170 = l_164 - u32(256);
let l_171 = l_170 << u32(23);
let l_172 = l_133 | l_171;
let l_173 = l_mut_154 & u32(8388607);
let l_174 = l_172 | l_173;
let l_175 = select(l_133, l_174, l_169);
let l_176 = bitcast<f32>(l_175);
let l_177 = select(f32(1.0), l_176, l_131);
shared_memory_13[l_mut_124] = l_177;
let l_178 = workgroup_id.z * info.scalars_u32[1];
let l_179 = l_178 + workgroup_id.y;
let l_180 = l_179 * info.scalars_u32[2];
let l_181 = l_180 + workgroup_id.x;
let l_182 = l_181 * u32(1);
let l_183 = l_182 + l_mut_124;
let l_184 = l_177 * info.scalars_f32[0];
buffer_2_global[l_183] = l_184;
}
workgroupBarrier();

for (var l_mut_185: u32 = u32(0); l_mut_185 < u32(4); l_mut_185++) {
let l_186 = l_mut_185 * u32(16);
let l_187 = l_186 + l_1;
let l_188 = l_2 + l_187;
let l_189 = l_187 < u32(64);
let l_190 = l_188 < info.scalars_u32[0];
let l_191 = l_189 && l_190;
if l_191 {
l_mut_154 = u32(0);
let l_192 = shared_memory_13[l_mut_154];
let l_193 = f32(1.0) / l_192;
let l_194 = l_188 * info.scalars_u32[5];
let l_195 = l_5 + l_194;

for (var l_mut_196: u32 = l_0; l_mut_196 < u32(16); l_mut_196 += u32(8)) {
let l_197 = l_195 / u32(4);
let l_198 = l_197 + l_mut_196;
let l_199 = buffer_0_global[l_198];
let l_200 = vec4<f32>(l_199);
l_mut_30 = l_200;
l_mut_154 = u32(0);

for (var l_mut_201: u32 = u32(0); l_mut_201 < u32(4); l_mut_201++) {
let l_202 = l_mut_30[l_mut_201];
let l_203 = abs(l_202);
let l_204 = l_203 * l_193;
l_mut_19 = l_204;
let l_205 = floor(l_204);
let l_206 = l_204 - l_205;
let l_207 = l_206 - f32(0.5);
let l_208 = abs(l_207);
let l_209 = l_208 < f32(6.103515625e-5);
if l_209 {
let l_210 = abs(l_202);
let l_211 = bitcast<u32>(l_192);
let l_212 = bitcast<u32>(l_210);
let l_213 = l_212 & u32(2147483648);
let l_214 = l_212 >> u32(23);
let l_215 = l_214 & u32(255);
let l_216 = l_211 >> u32(23);
let l_217 = l_216 & u32(255);
let l_218 = l_212 & u32(8388607);
let l_219 = l_218 | u32(8388608);
let l_220 = l_211 & u32(8388607);
let l_221 = l_220 | u32(8388608);
let l_222 = l_219 < l_221;
let l_223 = select(u32(0), u32(1), l_222);
let l_224 = l_219 << l_223;
l_mut_150 = l_224;
let l_225 = l_215 + u32(127);
let l_226 = l_225 + u32(256);
let l_227 = l_226 - l_217;
let l_228 = l_227 - l_223;
l_mut_145 = u32(0);

for (var l_mut_229: u32 = u32(0); l_mut_229 < u32(25); l_mut_229++) {
l_mut_145 = l_mut_145 << u32(1);
let l_230 = l_mut_150 >= l_221;
if l_230 {
l_mut_150 = l_mut_150 - l_221;
l_mut_145 = l_mut_145 | u32(1);
}
l_mut_150 = l_mut_150 << u32(1);
}
let l_231 = l_mut_145 >> u32(1);
l_mut_232 = l_231;
let l_233 = l_mut_145 & u32(1);
let l_234 = l_233 == u32(1);
let l_235 = l_mut_150 != u32(0);
let l_236 = l_mut_232 & u32(1);
let l_237 = l_236 == u32(1);
let l_238 = l_235 || l_237;
let l_239 = l_234 && l_238;
let l_240 = select(u32(0), u32(1), l_239);
l_mut_232 = l_mut_232 + l_240;
let l_241 = l_mut_232 >> u32(24);
l_mut_232 = l_mut_232 >> l_241;
let l_242 = l_228 + l_241;
let l_243 = l_215 != u32(0);
let l_244 = l_242 >= u32(257);
let l_245 = l_243 && l_244;
let l_246 = l_242 <= u32(510);
let l_247 = l_245 && l_246;
let l_248 = l_242 - u32(256);
let l_249 = l_248 << u32(23);
let l_250 = l_213 | l_249;
let l_251 = l_mut_232 & u32(8388607);
let l_252 = l_250 | l_251;
let l_253 = select(l_213, l_252, l_247);
let l_254 = bitcast<f32>(l_253);
l_mut_19 = l_254;
}
let l_255 = round(l_mut_19);
let l_256 = min(l_255, f32(127.0));
let l_257 = l_202 < f32(0.0);
let l_258 = -l_256;
let l_259 = select(l_256, l_258, l_257);
let l_260 = l_259 < f32(0.0);
let l_261 = l_259 + f32(256.0);
let l_262 = select(l_259, l_261, l_260);
let l_263 = u32(l_262);
let l_264 = u32(8) * l_mut_201;
let l_265 = l_263 << l_264;
l_mut_154 = l_mut_154 | l_265;
}
let l_266 = l_195 / u32(4);
let l_267 = l_266 + l_mut_196;
buffer_1_global[l_267] = l_mut_154;
}
}
}
}
